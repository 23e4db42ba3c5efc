/* SPDX-License-Identifier: MIT */
/* hello.c — using libl2l from C: tensors, an op, pool statistics and error handling.
 *
 * Build against an installed l2l (`make install`):  cc hello.c $(pkg-config --cflags --libs l2l) -o hello
 * or against a checkout's build:  cc examples/hello.c -Iinclude -Lbuild -ll2l -Wl,-rpath,$PWD/build -o hello
 * (`make` also builds it as build/hello.) Prints a 2x2 product, the host pool's bytes in
 * use, the message of a call that is refused, and whether cuDNN could be loaded (and why
 * not: a C++ library opened in a C program, GPU or not).
 */
#include <stdio.h>

#include "l2l.h"

#define OR_FAIL(call)                                       \
  do {                                                      \
    if ((call) != L2L_OK) {                                 \
      fprintf(stderr, "hello: %s\n", l2l_last_error());     \
      return 1;                                             \
    }                                                       \
  } while (0)

int main(void) {
  int64_t shape[2] = {2, 2};
  l2l_tensor *a = NULL, *b = NULL, *c = NULL;
  OR_FAIL(l2l_tensor_new(&a, L2L_POOL_HOST, L2L_F32, 2, shape));
  OR_FAIL(l2l_tensor_new(&b, L2L_POOL_HOST, L2L_F32, 2, shape));
  OR_FAIL(l2l_tensor_new(&c, L2L_POOL_HOST, L2L_F32, 2, shape));
  float *pa = l2l_tensor_data(a), *pb = l2l_tensor_data(b), *pc = l2l_tensor_data(c);
  for (int i = 0; i < 4; i++) pa[i] = (float)(i + 1), pb[i] = (float)(i == 0 || i == 3);
  pb[1] = 2.0f;                                 /* b = [[1, 2], [0, 1]] */
  OR_FAIL(l2l_gemm(c, a, b, 0, 0, 1.0f, 0.0f)); /* c = a b */
  printf("c = [[%g, %g], [%g, %g]]\n", pc[0], pc[1], pc[2], pc[3]);

  l2l_pool_stats stats;
  OR_FAIL(l2l_pool_get_stats(&stats, L2L_POOL_HOST));
  printf("host pool: %llu bytes in use, peak %llu\n", (unsigned long long)stats.current,
         (unsigned long long)stats.peak);

  int64_t wrong[2] = {3, 3};
  l2l_tensor *d = NULL;
  OR_FAIL(l2l_tensor_new(&d, L2L_POOL_HOST, L2L_F32, 2, wrong));
  if (l2l_gemm(c, a, d, 0, 0, 1.0f, 0.0f) != L2L_OK) printf("refused: %s\n", l2l_last_error());

  char about[256];
  int cudnn = l2l_cudnn_available(about, sizeof about);
  printf("cuDNN: %s%s\n", cudnn ? "" : "none: ", about);

  l2l_tensor_free(a), l2l_tensor_free(b), l2l_tensor_free(c), l2l_tensor_free(d);
  return 0;
}
