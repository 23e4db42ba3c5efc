-- SPDX-License-Identifier: MIT
-- l2l.plot — line charts of a training run (loss curves, memory over steps) as a picture:
-- a PNG through gnuplot when it is installed, otherwise an SVG written here.
--
--   local plot = require("l2l.plot")
--   local path = plot.write("build/demo/curves", {
--     title = "byte-level GPT",
--     panels = {
--       { title = "loss", xlabel = "step", ylabel = "nats per byte",
--         series = { { name = "train", x = steps, y = losses },
--                    { name = "validation", x = eval_steps, y = val_losses, marks = true } } },
--       { title = "memory", xlabel = "step", ylabel = "MiB",
--         series = { { name = "device peak", x = steps, y = peaks } },
--         hlines = { { name = "device budget", y = budget } } },
--     } }, { format = "auto" })          -- "auto" | "png" | "svg"; returns the file written
--
--   local fig = plot.metrics_figure(plot.read_metrics("build/demo/metrics.jsonl"), { title = "..." })
--   $ l2l plot build/demo/metrics.jsonl [out.svg | out.png]     -- plot.main: the same from a shell
--
-- plot.read_metrics(path) -> records: a metrics log of JSON lines (what examples/train_gpt.lua
--   writes: step, loss, val_loss, device_peak, device_budget, host_bytes, ...), one table
--   per line; a line that is not a JSON object is an error naming the file and the line.
-- plot.metrics_figure(records [, {title =}]) -> figure: a loss panel (train and validation)
--   whose axis comes from the losses (it starts at 0 only when they come near it), and a
--   memory panel (device peak, host memory, the device budget) from 0.
-- plot.main(args) -> exit status: `l2l plot METRICS [OUT] [--title T]` (src/runner/main.c calls
--   it): OUT.svg or OUT.png (a PNG needs gnuplot), by default curves.png or curves.svg
--   beside METRICS, as the demo would have written it: installing gnuplot after a run
--   does not mean training again.
--
-- Purpose: a picture of a run with no dependency beyond what a Debian machine with a C
-- toolchain has. Panels are stacked vertically and share nothing but the figure; each has
-- axes with "nice" ticks (1, 2 or 5 times a power of ten), tick labels, axis labels, a
-- title, a legend (a row above the plot area, so it never hides a line), one polyline
-- per series (markers where asked) and dashed horizontal reference lines. gnuplot gets the same description (data files plus a script in a
-- temporary folder); if it fails, the SVG is written instead and the reason returned.
-- Must never: leave temporary files behind, write text into the SVG without escaping it,
-- or draw a non-finite value (such points are skipped: a diverged run still plots).
local argcheck = require("l2l.argcheck")
local filesys = require("l2l.filesys")

local type, tostring, ipairs, floor, abs, max, min = type, tostring, ipairs, math.floor, math.abs,
                                                     math.max, math.min
local format, concat, select, too_many = string.format, table.concat, select, argcheck.too_many

local M = {}

-- Colours of series in order (colour-blind friendly, Okabe–Ito), then reference lines.
local COLOURS = { "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000" }
local REFERENCE = "#7f7f7f"

local function finite(v) return type(v) == "number" and v == v and v > -math.huge and v < math.huge end

----------------------------------------------------------------- checking the figure

-- What a figure, a panel, a series and a reference line may hold (anything else is an
-- error naming it: a misspelt "ylable" would otherwise vanish from the picture).
local FIGURE = { title = true, panels = true }
local PANEL = { title = true, xlabel = true, ylabel = true, series = true, hlines = true, ymin = true }
local SERIES = { name = true, x = true, y = true, marks = true, colour = true }
local HLINE = { name = true, y = true }

local function check_figure(fig, fname)
  if type(fig) ~= "table" then error(fname .. ": figure must be a table, got " .. argcheck.describe(fig), 3) end
  argcheck.fields(fig, FIGURE, fname, 3, "figure")
  if type(fig.panels) ~= "table" or #fig.panels == 0 then
    error(fname .. ": figure.panels must be a non-empty list of panels", 3)
  end
  for p, panel in ipairs(fig.panels) do
    if type(panel) ~= "table" then error(("%s: figure.panels[%d] must be a table"):format(fname, p), 3) end
    argcheck.fields(panel, PANEL, fname, 3, ("figure.panels[%d]"):format(p))
    if panel.series ~= nil and type(panel.series) ~= "table" then
      error(("%s: figure.panels[%d].series must be a list of series"):format(fname, p), 3)
    end
    if panel.hlines ~= nil and type(panel.hlines) ~= "table" then
      error(("%s: figure.panels[%d].hlines must be a list of lines"):format(fname, p), 3)
    end
    for s, series in ipairs(panel.series or {}) do
      local where = ("%s: figure.panels[%d].series[%d]"):format(fname, p, s)
      if type(series) ~= "table" or type(series.x) ~= "table" or type(series.y) ~= "table" then
        error(where .. " must be a table with lists x and y", 3)
      end
      argcheck.fields(series, SERIES, fname, 3, ("figure.panels[%d].series[%d]"):format(p, s))
      if #series.x ~= #series.y then
        error(("%s: x has %d values but y has %d"):format(where, #series.x, #series.y), 3)
      end
    end
    for h, line in ipairs(panel.hlines or {}) do
      if type(line) ~= "table" or not finite(line.y) then
        error(("%s: figure.panels[%d].hlines[%d] must be a table with a finite number y"):format(fname, p, h), 3)
      end
      argcheck.fields(line, HLINE, fname, 3, ("figure.panels[%d].hlines[%d]"):format(p, h))
    end
  end
end

-- Whether a value can be drawn: finite, and small enough that a range of two of them,
-- widened to whole ticks, stays finite (±1e308 made the axis inf - inf = nan). A run that
-- diverged past 1e300 is off the chart, as a NaN loss is.
local function plottable(v) return finite(v) and abs(v) <= 1e300 end

-- The plottable points of a series, as two lists.
local function points(series)
  local xs, ys = {}, {}
  for i = 1, #series.x do
    local x, y = series.x[i], series.y[i]
    if plottable(x) and plottable(y) then xs[#xs + 1], ys[#ys + 1] = x, y end
  end
  return xs, ys
end

----------------------------------------------------------------- axes

-- A "nice" step near range/target: 1, 2 or 5 times a power of ten.
local function nice_step(range, target)
  if range <= 0 then return 1 end
  local raw = range / target
  local p = 10 ^ floor(math.log10(raw))
  local f = raw / p
  return (f < 1.5 and 1 or f < 3.5 and 2 or f < 7.5 and 5 or 10) * p
end

-- Axis limits widened to whole ticks, and the ticks: lo, hi, step.
local function axis(lo, hi, target)
  if lo == nil then lo, hi = 0, 1 end
  if hi - lo < 1e-12 * max(abs(lo), abs(hi), 1) then   -- one value: a unit around it
    local pad = max(abs(lo) * 0.1, 0.5)
    lo, hi = lo - pad, hi + pad
  end
  local step = nice_step(hi - lo, target)
  return floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step, step
end
-- plot.axis(lo, hi, target) -> lo, hi, step: limits widened to whole "nice" ticks, about
-- `target` of them (lo and hi nil: no data, 0 to 1).
function M.axis(lo, hi, target, ...)
  if select("#", ...) ~= 0 then too_many("plot.axis", "lo, hi, target", 2, ...) end
  if not (lo == nil and hi == nil) and not (finite(lo) and finite(hi) and lo <= hi) then
    error(("plot.axis: lo and hi must be finite numbers, lo <= hi (or both nil), got %s and %s"):format(
      argcheck.describe(lo), argcheck.describe(hi)), 2)
  end
  if not finite(target) or target <= 0 then
    error("plot.axis: target must be a number > 0, got " .. argcheck.describe(target), 2)
  end
  local a, b, step = axis(lo, hi, target)
  return a, b, step
end

-- Tick label: no trailing zeros, no "-0".
local function tick_label(v, step)
  if abs(v) < step * 1e-6 then return "0" end
  local decimals = min(max(0, -floor(math.log10(step) + 1e-9)), 6)
  local s = format("%." .. format("%d", decimals) .. "f", v)   -- %d: never "-0"
  if abs(v) >= 1e6 then s = format("%g", v) end
  return s
end

-- Data ranges of a panel: xlo, xhi, ylo, yhi (nil when it has no finite point).
local function ranges(panel)
  local xlo, xhi, ylo, yhi
  for _, series in ipairs(panel.series or {}) do
    local xs, ys = points(series)
    for i = 1, #xs do
      xlo, xhi = min(xlo or xs[i], xs[i]), max(xhi or xs[i], xs[i])
      ylo, yhi = min(ylo or ys[i], ys[i]), max(yhi or ys[i], ys[i])
    end
  end
  for _, line in ipairs(panel.hlines or {}) do
    if plottable(line.y) then ylo, yhi = min(ylo or line.y, line.y), max(yhi or line.y, line.y) end
  end
  if panel.ymin ~= nil and yhi ~= nil then ylo = min(panel.ymin, yhi) end   -- (no data: 0 to 1)
  return xlo, xhi, ylo, yhi
end

----------------------------------------------------------------- SVG

local function esc(s)
  return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"):gsub('"', "&quot;"))
end

local function num(v) return format("%.1f", v) end

local SVG_OPTIONS = { width = true, panel_height = true }

local function svg(fig, opts)
  local W, PH = opts.width or 900, opts.panel_height or 340
  local top = fig.title and 40 or 10
  local H = top + PH * #fig.panels
  local out = {}
  local function add(...) out[#out + 1] = concat({ ... }) end
  add(format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ', W, H, W, H),
      'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">')
  add(format('<rect x="0" y="0" width="%d" height="%d" fill="white"/>', W, H))
  if fig.title then
    add(format('<text x="%d" y="26" text-anchor="middle" font-size="16" font-weight="bold">%s</text>', W / 2, esc(fig.title)))
  end
  for p, panel in ipairs(fig.panels) do
    -- plot area of this panel
    -- title, then a row of legend entries, then the plot area: the legend never hides data
    local y0 = top + (p - 1) * PH
    local L, R, T, B = 80, W - 30, y0 + 50, y0 + PH - 50
    local xlo, xhi, ylo, yhi = ranges(panel)
    local xstep, ystep
    xlo, xhi, xstep = axis(xlo, xhi, 8)
    if yhi ~= nil then yhi = yhi + 0.04 * (yhi - ylo) end   -- a line at the maximum stays inside
    ylo, yhi, ystep = axis(ylo, yhi, 5)
    local function X(v) return L + (v - xlo) / (xhi - xlo) * (R - L) end
    local function Y(v) return B - (v - ylo) / (yhi - ylo) * (B - T) end
    add(format('<g class="panel" id="panel%d">', p))
    if panel.title then
      add(format('<text x="%s" y="%s" text-anchor="middle" font-size="14">%s</text>', num((L + R) / 2), num(T - 30), esc(panel.title)))
    end
    -- grid and ticks
    local v = xlo
    while v <= xhi + xstep * 1e-6 do
      local x = X(v)
      add(format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e5e5e5"/>', num(x), num(T), num(x), num(B)))
      add(format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="black"/>', num(x), num(B), num(x), num(B + 5)))
      add(format('<text x="%s" y="%s" text-anchor="middle">%s</text>', num(x), num(B + 18), tick_label(v, xstep)))
      v = v + xstep
    end
    v = ylo
    while v <= yhi + ystep * 1e-6 do
      local y = Y(v)
      add(format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e5e5e5"/>', num(L), num(y), num(R), num(y)))
      add(format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="black"/>', num(L - 5), num(y), num(L), num(y)))
      add(format('<text x="%s" y="%s" text-anchor="end">%s</text>', num(L - 8), num(y + 4), tick_label(v, ystep)))
      v = v + ystep
    end
    add(format('<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="black"/>', num(L), num(T), num(R - L), num(B - T)))
    -- axis labels
    if panel.xlabel then
      add(format('<text x="%s" y="%s" text-anchor="middle">%s</text>', num((L + R) / 2), num(B + 38), esc(panel.xlabel)))
    end
    if panel.ylabel then
      add(format('<text x="20" y="%s" text-anchor="middle" transform="rotate(-90 20 %s)">%s</text>',
                 num((T + B) / 2), num((T + B) / 2), esc(panel.ylabel)))
    end
    -- reference lines, then series (clipped to the plot area)
    add(format('<clipPath id="clip%d"><rect x="%s" y="%s" width="%s" height="%s"/></clipPath>', p, num(L), num(T), num(R - L), num(B - T)))
    add(format('<g clip-path="url(#clip%d)">', p))
    local legend = {}
    for _, line in ipairs(panel.hlines or {}) do
      if plottable(line.y) then
        add(format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1.5" stroke-dasharray="6,4"/>',
                   num(L), num(Y(line.y)), num(R), num(Y(line.y)), REFERENCE))
        if line.name then legend[#legend + 1] = { name = line.name, colour = REFERENCE, dashed = true } end
      end
    end
    for s, series in ipairs(panel.series or {}) do
      local colour = series.colour or COLOURS[(s - 1) % #COLOURS + 1]
      local xs, ys = points(series)
      if #xs > 0 then
        local pts = {}
        for i = 1, #xs do pts[i] = num(X(xs[i])) .. "," .. num(Y(ys[i])) end
        add(format('<polyline fill="none" stroke="%s" stroke-width="1.8" stroke-linejoin="round" points="%s"/>',
                   colour, concat(pts, " ")))
        if series.marks then
          for i = 1, #xs do
            add(format('<circle cx="%s" cy="%s" r="3" fill="%s"/>', num(X(xs[i])), num(Y(ys[i])), colour))
          end
        end
      end
      if series.name then legend[#legend + 1] = { name = series.name, colour = colour, marks = series.marks } end
    end
    add("</g>")
    -- legend: one row above the plot area, entries side by side from the right
    if #legend > 0 then
      add('<g class="legend">')
      local x = R
      for i = #legend, 1, -1 do
        local e = legend[i]
        local w = 36 + #e.name * 7 + 16
        x = x - w
        local cy = T - 10
        add(format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>', num(x), num(cy),
                   num(x + 28), num(cy), e.colour, e.dashed and ' stroke-dasharray="6,4"' or ""))
        if e.marks then add(format('<circle cx="%s" cy="%s" r="3" fill="%s"/>', num(x + 14), num(cy), e.colour)) end
        add(format('<text x="%s" y="%s">%s</text>', num(x + 34), num(cy + 4), esc(e.name)))
      end
      add("</g>")
    end
    add("</g>")
  end
  add("</svg>")
  return concat(out, "\n") .. "\n"
end

-- plot.svg(figure [, {width = 900, panel_height = 340}]) -> the SVG text of a figure.
function M.svg(fig, opts, ...)
  local fname = "plot.svg"
  if select("#", ...) ~= 0 then too_many(fname, "figure, opts", 2, ...) end
  check_figure(fig, fname)
  opts = argcheck.options(opts, SVG_OPTIONS, fname, 2, "opts")
  local text = svg(fig, opts)
  return text
end

----------------------------------------------------------------- gnuplot

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function gp_quote(s) return "'" .. tostring(s):gsub("'", "''") .. "'" end   -- gnuplot: '' is '

function M.have_gnuplot(...)
  if select("#", ...) ~= 0 then too_many("plot.have_gnuplot", "", 2, ...) end
  local p = io.popen("command -v gnuplot 2>/dev/null")
  local found = p:read("*l")
  p:close()
  return found ~= nil and found ~= ""
end

local function remove_tree(dir)
  os.execute("rm -rf " .. shell_quote(dir))
end

-- Writes `path` (a PNG) through gnuplot; returns true, or nil and why not.
local function gnuplot_png(fig, path)
  local dir = os.tmpname()
  os.remove(dir)
  if not os.execute("mkdir -p " .. shell_quote(dir)) then return nil, "cannot make a temporary folder" end
  local ok, why = pcall(function()
    local script = {}
    local function add(line) script[#script + 1] = line end
    -- a terminal list: pngcairo (anti-aliased) if this gnuplot has it, else png
    add("set terminal pngcairo size 900," .. (40 + 340 * #fig.panels) .. " font ',10'")
    add("set output " .. gp_quote(path))
    add(("set multiplot layout %d,1%s"):format(#fig.panels, fig.title and (" title " .. gp_quote(fig.title) .. " font ',13'") or ""))
    for p, panel in ipairs(fig.panels) do
      -- the key in a row above the plot (as in the SVG), and 5 % headroom for the top line
      add("set grid; set key outside top right horizontal noautotitle")
      add("set offsets 0, 0, graph 0.05, 0")
      add("set title " .. gp_quote(panel.title or ""))
      add("set xlabel " .. gp_quote(panel.xlabel or ""))
      add("set ylabel " .. gp_quote(panel.ylabel or ""))
      add(panel.ymin ~= nil and ("set yrange [%g:*]"):format(panel.ymin) or "set yrange [*:*]")
      local terms = {}
      for s, series in ipairs(panel.series or {}) do
        local xs, ys = points(series)
        if #xs > 0 then
          local file = ("%s/p%d_s%d.dat"):format(dir, p, s)
          local f = assert(io.open(file, "w"))
          for i = 1, #xs do f:write(("%.9g %.9g\n"):format(xs[i], ys[i])) end
          f:close()
          local colour = series.colour or COLOURS[(s - 1) % #COLOURS + 1]
          terms[#terms + 1] = ("%s using 1:2 with %s lw 2 lc rgb '%s' title %s"):format(gp_quote(file),
            series.marks and "linespoints pt 7 ps 0.6" or "lines", colour, gp_quote(series.name or ""))
        end
      end
      for _, line in ipairs(panel.hlines or {}) do
        terms[#terms + 1] = ("%.9g with lines dt 2 lw 1.5 lc rgb '%s' title %s"):format(line.y, REFERENCE,
          gp_quote(line.name or ""))
      end
      if #terms == 0 then terms[1] = "NaN notitle" end
      add("plot " .. concat(terms, ", \\\n     "))
    end
    add("unset multiplot")
    add("set output")
    local gp = dir .. "/figure.gp"
    local f = assert(io.open(gp, "w"))
    f:write(concat(script, "\n"), "\n")
    f:close()
    local run = "gnuplot " .. shell_quote(gp) .. " > " .. shell_quote(dir .. "/log") .. " 2>&1"
    if not os.execute(run) then
      -- an older or minimal gnuplot without cairo: the GD "png" terminal
      local f2 = assert(io.open(gp, "w"))
      f2:write((concat(script, "\n"):gsub("set terminal pngcairo", "set terminal png")), "\n")
      f2:close()
      if not os.execute(run) then
        local lf = io.open(dir .. "/log")
        local log = lf and lf:read("*a") or ""
        if lf then lf:close() end
        error("gnuplot failed: " .. (log:match("[^\n]*\n?[^\n]*$") or log), 0)
      end
    end
  end)
  remove_tree(dir)
  if not ok then return nil, tostring(why) end
  local f = io.open(path, "rb")
  local head = f and f:read(8) or ""
  if f then f:close() end
  if head ~= "\137PNG\r\n\26\n" then return nil, "gnuplot wrote no PNG" end
  return true
end

----------------------------------------------------------------- writing

-- plot.write(base, figure [, {format = "auto" | "png" | "svg", width =, panel_height =}])
-- -> path written, format, note (why a PNG was asked for and an SVG written, else nil).
-- base: the path without extension (".png" or ".svg" is added); width and panel_height
-- are the SVG's (plot.svg).
local WRITE_OPTIONS = { format = true, width = true, panel_height = true }

function M.write(base, fig, opts, ...)
  local fname = "plot.write"
  if select("#", ...) ~= 0 then too_many(fname, "base, figure, opts", 2, ...) end
  if type(base) ~= "string" or base == "" then error(fname .. ": base must be a non-empty path", 2) end
  check_figure(fig, fname)
  opts = argcheck.options(opts, WRITE_OPTIONS, fname, 2, "opts")
  local fmt = opts.format or "auto"
  if fmt ~= "auto" and fmt ~= "png" and fmt ~= "svg" then
    error(fname .. ': opts.format must be "auto", "png" or "svg", got ' .. tostring(fmt), 2)
  end
  local note
  if fmt ~= "svg" then
    if M.have_gnuplot() then
      local ok, why = gnuplot_png(fig, base .. ".png")
      if ok then return base .. ".png", "png" end
      note = why
    else
      note = "gnuplot is not installed"
    end
  end
  local path = base .. ".svg"
  local f, err = io.open(path, "w")
  if not f then error(fname .. ": cannot write " .. path .. ": " .. tostring(err), 2) end
  f:write(svg(fig, opts))
  f:close()
  return path, "svg", note
end

----------------------------------------------------------------- metrics logs

-- plot.metrics_line(rec) -> one line of a metrics log (JSON, no newline) for a table of
-- numbers and strings. A number that is not one (a diverged run's loss: NaN, +-inf) is
-- written as what it is, the string "nan", "inf" or "-inf": JSON has no such numbers, and
-- a writer must not fail on the step that most needs recording. read_metrics gives them
-- back as numbers; the curves leave them out.
local NONFINITE = { nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge }

function M.metrics_line(rec, ...)
  if select("#", ...) ~= 0 then too_many("plot.metrics_line", "rec", 2, ...) end
  if type(rec) ~= "table" then error("plot.metrics_line: rec must be a table, got " .. argcheck.describe(rec), 2) end
  local out = {}
  for k, v in pairs(rec) do
    if type(v) == "number" and v ~= v then v = "nan"
    elseif v == math.huge then v = "inf"
    elseif v == -math.huge then v = "-inf" end
    out[k] = v
  end
  local ok, text = pcall(require("cjson").encode, out)
  if not ok then error("plot.metrics_line: " .. tostring(text), 2) end
  return text
end

function M.read_metrics(path, ...)
  local fname = "plot.read_metrics"
  if select("#", ...) ~= 0 then too_many(fname, "path", 2, ...) end
  if type(path) ~= "string" or path == "" then error(fname .. ": path must be a file name, got " .. argcheck.describe(path), 2) end
  local cjson = require("cjson")
  local regular, not_regular = filesys.regular_file(path)
  if not regular then error(("%s: cannot read %s: %s"):format(fname, path, not_regular), 2) end
  local f, err = io.open(path, "rb")
  if not f then error(("%s: cannot read %s"):format(fname, tostring(err)), 2) end
  local records, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:match("%S") then
      local ok, rec = pcall(cjson.decode, line)
      if not ok or type(rec) ~= "table" then
        f:close()
        if line:find("[%z\1-\8\14-\31]") then   -- a binary file (a checkpoint, say)
          error(("%s: %s is not a metrics log (JSON lines, as a run's metrics.jsonl): line %d is not text"):format(
            fname, path, n), 2)
        end
        error(("%s: %s:%d is not a JSON object: %s"):format(fname, path, n, ok and type(rec) or tostring(rec)), 2)
      end
      for k, v in pairs(rec) do
        if v == cjson.null then rec[k] = nil end   -- JSON null: no value at this step
        if k ~= "run" and NONFINITE[v] then rec[k] = NONFINITE[v] end   -- metrics_line's
      end
      if not finite(rec.step) then
        f:close()
        error(("%s: %s:%d: step must be a number, got %s"):format(fname, path, n, argcheck.describe(rec.step)), 2)
      end
      records[#records + 1] = rec
    end
  end
  f:close()
  return records
end

local METRICS_FIGURE = { title = true }

local function mib(bytes) return bytes / 2 ^ 20 end

function M.metrics_figure(records, opts, ...)
  local fname = "plot.metrics_figure"
  if select("#", ...) ~= 0 then too_many(fname, "records, opts", 2, ...) end
  if type(records) ~= "table" then error(fname .. ": records must be a list of tables, got " .. argcheck.describe(records), 2) end
  opts = argcheck.options(opts, METRICS_FIGURE, fname, 2, "opts")
  local xs, train_y, vx, vy, mx, peak, host = {}, {}, {}, {}, {}, {}, {}
  local budget
  for i, rec in ipairs(records) do
    if type(rec) ~= "table" or type(rec.step) ~= "number" then
      error(("%s: records[%d] must be a table with a number step"):format(fname, i), 2)
    end
    if finite(rec.loss) then xs[#xs + 1], train_y[#train_y + 1] = rec.step, rec.loss end
    if finite(rec.val_loss) then vx[#vx + 1], vy[#vy + 1] = rec.step, rec.val_loss end
    if type(rec.device_peak) == "number" or type(rec.host_bytes) == "number" then
      mx[#mx + 1] = rec.step
      peak[#peak + 1] = type(rec.device_peak) == "number" and mib(rec.device_peak) or 0 / 0
      host[#host + 1] = type(rec.host_bytes) == "number" and mib(rec.host_bytes) or 0 / 0
    end
    if type(rec.device_budget) == "number" and rec.device_budget > 0 then budget = rec.device_budget end
  end
  local panels = {
    { title = "loss (nats per byte)", xlabel = "step", ylabel = "loss",
      series = { { name = "train", x = xs, y = train_y }, { name = "validation", x = vx, y = vy, marks = true } } },
  }
  if #mx > 0 then
    panels[2] = { title = "memory", xlabel = "step", ylabel = "MiB", ymin = 0,
                  series = { { name = "device peak", x = mx, y = peak },
                             { name = "host (EPS: weights, gradients, AdamW state)", x = mx, y = host } },
                  hlines = budget and { { name = "device budget", y = mib(budget) } } or {} }
  end
  return { title = opts.title, panels = panels }
end

----------------------------------------------------------------- l2l plot

-- The file written for `out` (nil: curves.<format> beside the metrics): base and format.
local function destination(metrics, out)
  if out == nil then
    local dir = metrics:match("^(.*)/[^/]*$") or "."
    return dir .. "/curves", "auto"
  end
  local base, ext = out:match("^(.*)%.([%w]+)$")
  ext = ext and ext:lower()
  if ext ~= "svg" and ext ~= "png" then return nil, ("OUT must end in .svg or .png, got '%s'"):format(out) end
  return base, ext
end

function M.main(args, ...)
  if select("#", ...) ~= 0 then too_many("plot.main", "args", 2, ...) end
  if type(args) ~= "table" then error("plot.main: args must be a list of strings, got " .. argcheck.describe(args), 2) end
  local cli = require("l2l.cli")
  local parser = cli.parser {
    name = "l2l plot", usage = "l2l plot",
    description = "Redraws the curves of a training run (loss, validation loss, memory) from its metrics " ..
                  "log, as examples/train_gpt.lua draws them at its end.",
    epilog = "OUT ending in .png needs gnuplot; without OUT, curves.png (when gnuplot is installed) or " ..
             "curves.svg is written beside METRICS.",
    flags = { { "--title", nil, "string", "the figure's title (default: the metrics file's name)", meta = "TEXT" } },
  }
  parser:argument("metrics", "a metrics log of JSON lines (e.g. build/demo/metrics.jsonl)"):argname("METRICS")
  parser:argument("out", "the picture to write: a name ending in .svg or .png"):args("?"):argname("OUT")
  local opt = cli.parse(parser, args)
  local base, format = destination(opt.metrics, opt.out)
  if base == nil then cli.fail(format) end
  if format == "png" and not M.have_gnuplot() then
    cli.fail(opt.out .. ": gnuplot is not installed (apt-get install gnuplot-nox), so no PNG; name an .svg instead")
  end
  local ok, records = pcall(M.read_metrics, opt.metrics)
  if not ok then cli.fail((tostring(records):gsub("^.-plot%.read_metrics: ", ""))) end
  local made, fig = pcall(M.metrics_figure, records, { title = opt.title or opt.metrics })
  if not made then cli.fail((tostring(fig):gsub("^.-plot%.metrics_figure: ", ""))) end
  local written, path, _, note = pcall(M.write, base, fig, { format = format })
  if not written then cli.fail((tostring(path):gsub("^.-plot%.write: ", ""))) end
  if format == "png" and note then cli.fail(opt.out .. ": " .. note) end
  print(("picture: %s (%d records%s)"):format(path, #records, note and ("; " .. note) or ""))
  return 0
end

return M
