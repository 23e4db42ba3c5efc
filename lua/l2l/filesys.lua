-- SPDX-License-Identifier: MIT
-- l2l.filesys — what a loader asks of the file system before it opens a path: is it a
-- regular file (and its size), and a folder's entries.
--
-- Purpose: no loader blocks on a FIFO or reads a directory as a file, and a path may hold
-- any character (no shell).
-- Must never: open a file it was asked about, or change anything on disk.
local ffi = require("ffi")

local M = {}

----------------------------------------------------------------- folders and files
-- Read through the FFI (opendir / readdir64 and statx: Linux glibc, whose records have
-- these layouts on every architecture), never through a shell, so a path may hold any
-- character.

for _, decl in ipairs({   -- one at a time: another module may have declared one already
  "void *opendir(const char *name);",
  "int closedir(void *dir);",
  "struct l2l_dirent64 { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };",
  "struct l2l_dirent64 *readdir64(void *dir);",
  "int *__errno_location(void);",
  "char *strerror(int errnum);",
  -- statx's record is the same on every architecture (struct stat's is not): 256 bytes,
  -- the file type in the top bits of stx_mode.
  [[struct l2l_statx { uint32_t mask, blksize; uint64_t attributes; uint32_t nlink, uid, gid;
     uint16_t mode, pad; uint64_t ino, size, blocks, attributes_mask; uint8_t rest[192]; };]],
  "int statx(int dirfd, const char *path, int flags, unsigned int mask, struct l2l_statx *out);",
}) do pcall(ffi.cdef, decl) end
M.DT_UNKNOWN, M.DT_DIR, M.DT_REG = 0, 4, 8

local AT_FDCWD, STATX_TYPE, STATX_SIZE, S_IFMT = -100, 0x1, 0x200, 0xF000
local file_types = { [0x1000] = "a FIFO (a named pipe)", [0x2000] = "a character device",
                     [0x4000] = "a directory", [0x6000] = "a block device", [0xC000] = "a socket" }

-- true and its size when `path` names a regular file (through symbolic links), else nil
-- and why ("is a directory", "is a FIFO (a named pipe), not a regular file", or the
-- system's reason).
-- It only looks (statx), never opens: opening a FIFO to read waits for a writer, which
-- is how a loader used to block forever. Every loader asks before it opens.
function M.regular_file(path)
  local st = ffi.new("struct l2l_statx")
  if ffi.C.statx(AT_FDCWD, path, 0, STATX_TYPE + STATX_SIZE, st) ~= 0 then
    return nil, ffi.string(ffi.C.strerror(ffi.C.__errno_location()[0]))
  end
  local kind = bit.band(st.mode, S_IFMT)
  if kind == 0x8000 then return true, tonumber(st.size) end
  local what = file_types[kind] or "not a regular file"
  return nil, kind == 0x4000 and "is a directory" or ("is %s, not a regular file"):format(what)
end

-- The entries of folder `path` ({name =, type = d_type} each, without "." and ".."), or
-- nil and why when it cannot be opened (not a folder, not readable).
function M.list_folder(path)
  local dir = ffi.C.opendir(path)
  if dir == nil then return nil, ffi.string(ffi.C.strerror(ffi.C.__errno_location()[0])) end
  local entries = {}
  while true do
    local e = ffi.C.readdir64(dir)
    if e == nil then break end
    local name = ffi.string(e.d_name)
    if name ~= "." and name ~= ".." then entries[#entries + 1] = { name = name, type = e.d_type } end
  end
  ffi.C.closedir(dir)
  return entries
end

return M
