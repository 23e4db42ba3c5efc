/* SPDX-License-Identifier: MIT */
/* version.c — l2l_version: the library's version, "major.minor.patch".
 *
 * Purpose: the one place the version is written. The Makefile reads it from the line below
 * (the shared library's file name libl2l.so.<version>, its soname libl2l.so.<major>, and
 * pkg-config's Version), so what a program is linked against and what it reports cannot
 * disagree; the l2l executable prints it (l2l -v), Lua has it as l2l.version, and a
 * checkpoint records the version that wrote it.
 * Must never: be written anywhere else, or change the line's form without the Makefile's
 * reader (its VERSION).
 */
#include "core.h"

const char *l2l_version(void) { return "0.1.0"; }
