/* eps.c — the eager parameter server (being written). */
#include "internal.h"
