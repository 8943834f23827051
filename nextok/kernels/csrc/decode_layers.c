/* Every decoder layer of a Llama-family model for one decode step, in one call: the kernels the
 * Python layers call one by one (csrc/fused_ops.c, csrc/paged_decode.c and the GGUF block
 * matmuls), called here in the same order with the same arguments, so the results are the
 * Python path's bit for bit.
 *
 * Why: at one token on the default model a step makes ~330 kernel calls, and the Python and
 * torch work around each (modules, views, torch.empty, ctypes) was ~1/3 of the step on the
 * 2-core AVX2 machine, as much as llama.cpp's whole token took beside the matmuls. The kernels
 * come as function pointers (each from its own shared library), so none is built twice. A matrix
 * may hold parts of several block types (a *_K_M file's qkv: q and k Q4_K, v Q6_K) and a float32
 * bias (Qwen2's qkv), as GGUFBlockLinear does.
 *
 * Per layer (T rows, hidden size E, H query and KVH key/value heads of D, intermediate I):
 *   h = rms_norm(residual += x) * w_in          (layer 0: residual = x, no add)
 *   qkv [T, (H + 2 KVH) D] = h @ W_qkv^T        RoPE on the q and k heads; k, v into the caches
 *   a [T, H D] = paged_decode(q, caches)        o [T, E] = a @ W_o^T
 *   h = rms_norm(residual += o) * w_post        gu [T, 2I] = h @ W_gate_up^T
 *   x [T, E] = (silu(gate) * up) @ W_down^T
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' signatures; values are float32 or bfloat16 (the model's dtype, D_ELEM bytes) */
typedef int (*matmul_fn)(const void *x, int m, int k, const uint8_t *w, int type, int n, void *y,
                         int threads);
typedef void (*norm_fn)(const void *x, void *residual, const void *w, int rows, int d, float eps,
                        void *out, int add, int threads);
typedef void (*silu_fn)(const void *gate_up, int rows, int inter, void *out, int threads);
typedef void (*rope_fn)(void *qkv, int rows, int stride, int heads, int d, const void *cos,
                        const void *sin, int threads);
typedef int (*store_fn)(const char *qkv, int rows, long stride_bytes, long k_off, long kv_bytes,
                        char *k_cache, char *v_cache, const int64_t *slots, int64_t cache_rows);
/* int8 caches (D_KV_INT8): fused_ops.c's store_kv_q8_rows, which quantizes each head's row */
typedef int (*store_q8_fn)(const char *qkv, int rows, long stride_bytes, long k_off, int kv_heads,
                           int d, int elem, char *k_cache, char *v_cache, const int64_t *slots,
                           int64_t cache_rows);
typedef int (*attn_fn)(const void *q, const void *k_cache, const void *v_cache,
                       const int64_t *tables, const int64_t *lens, void *out, int B, int H,
                       int KVH, int D, int bs, int max_blocks, float scale, int window, int threads);

/* fns: the kernels' addresses, in this order (with int8 caches F_STORE is a store_q8_fn and
 * F_ATTN paged_decode_q8_f32 / _bf16) */
enum { F_NORM, F_SILU, F_ROPE, F_STORE, F_ATTN, F_COUNT };
/* one layer's row of `layers`: pointers, then for each matmul its first row in `segs`, how many
 * parts it has and its float32 bias (0: none) */
enum { L_IN_NORM, L_POST_NORM, L_K_CACHE, L_V_CACHE,
       L_QKV, L_O = L_QKV + 3, L_GU = L_O + 3, L_DOWN = L_GU + 3, L_COUNT = L_DOWN + 3 };
/* one part's row of `segs`: output rows of one ggml type (a *_K_M file's qkv holds q and k in one
 * type, v in another): its kernel, its blocks, their type, its rows */
enum { S_FN, S_BLOCKS, S_TYPE, S_ROWS, S_COUNT };
/* dims, in this order */
enum { D_ROWS, D_HIDDEN, D_HEADS, D_KV_HEADS, D_HEAD_DIM, D_INTER, D_BLOCK_SIZE, D_MAX_BLOCKS,
       D_WINDOW, D_THREADS, D_ELEM, D_KV_INT8, D_COUNT };

int decode_layers_count(void) { return (S_COUNT << 24) | (F_COUNT << 16) | (L_COUNT << 8) | D_COUNT; }

/* y [T, n] = x [T, k] @ W^T (+ bias), as GGUFBlockLinear.__call__: a one-part matrix straight into
 * y, several each into tmp [T, rows] and then into their columns of y. */
static int matmul(const int64_t *l, int at, const int64_t *segs, const void *x, int t, int k, int n,
                  char *y, char *tmp, size_t es, int threads) {
    const int64_t *s = segs + (size_t)l[at] * S_COUNT;
    const int parts = (int)l[at + 1];
    for (int p = 0, col = 0; p < parts; p++, s += S_COUNT) {
        const int rows = (int)s[S_ROWS];
        char *out = parts == 1 ? y : tmp;
        const int rc = ((matmul_fn)(intptr_t)s[S_FN])(x, t, k, (const uint8_t *)(intptr_t)s[S_BLOCKS],
                                                      (int)s[S_TYPE], rows, out, threads);
        if (rc) return rc;
        if (parts > 1)
            for (size_t r = 0; r < (size_t)t; r++)
                memcpy(y + (r * n + col) * es, tmp + r * rows * es, rows * es);
        col += rows;
    }
    const float *bias = (const float *)(intptr_t)l[at + 2];  /* float32 models only (cpu_decode.py) */
    if (bias)
        for (size_t r = 0; r < (size_t)t; r++)
            for (int j = 0; j < n; j++) ((float *)y)[r * n + j] += bias[j];
    return 0;
}

/* x [T, E]: the embeddings in, the last layer's MLP output out; residual [T, E]: the stream
 * out; both in the model's dtype. cos, sin [T, D / 2]; slots [T]; tables [T, max_blocks]; lens [T]; cache_rows: blocks *
 * block size. Returns 0; 1 if scratch memory could not be had; 2 + the kernel's code if a matmul
 * refused its arguments; -1 for a slot past the caches (nothing of that layer stored); -2 if
 * the attention kernel failed (more than 256 heads, or no memory). */
int decode_layers(const int64_t *fns, const int64_t *layers, const int64_t *segs, int num_layers, const int *dims,
                  float eps, float scale, char *x, char *residual, const void *cos,
                  const void *sin, const int64_t *slots, const int64_t *tables, const int64_t *lens,
                  int64_t cache_rows) {
    const int t = dims[D_ROWS], e = dims[D_HIDDEN], h = dims[D_HEADS], kvh = dims[D_KV_HEADS];
    const int d = dims[D_HEAD_DIM], inter = dims[D_INTER], threads = dims[D_THREADS];
    const size_t es = (size_t)dims[D_ELEM];
    const int q_size = h * d, kv_size = kvh * d, stride = q_size + 2 * kv_size;
    const norm_fn norm = (norm_fn)(intptr_t)fns[F_NORM];
    const silu_fn silu = (silu_fn)(intptr_t)fns[F_SILU];
    const rope_fn rope = (rope_fn)(intptr_t)fns[F_ROPE];
    const store_fn store = (store_fn)(intptr_t)fns[F_STORE];
    const attn_fn attn = (attn_fn)(intptr_t)fns[F_ATTN];
    /* hn [T, E] | qkv [T, stride] | q [T, H D] | a [T, H D] | o [T, E] | gu [T, 2I] | act [T, I]
     * | tmp [T, the widest matrix] (one part's output) */
    const int widest = stride > 2 * inter ? (stride > e ? stride : e) : (2 * inter > e ? 2 * inter : e);
    const size_t per_row = (size_t)2 * e + stride + 2 * q_size + e + 3 * (size_t)inter + widest;
    char *scratch = malloc(per_row * t * es);
    if (!scratch) return 1;
    char *hn = scratch, *qkv = hn + (size_t)t * e * es, *q = qkv + (size_t)t * stride * es;
    char *a = q + (size_t)t * q_size * es, *o = a + (size_t)t * q_size * es;
    char *gu = o + (size_t)t * e * es, *act = gu + (size_t)t * 2 * inter * es;
    char *tmp = act + (size_t)t * inter * es;
    int rc = 0;
    memcpy(residual, x, (size_t)t * e * es);
    for (int i = 0; i < num_layers && rc == 0; i++) {
        const int64_t *l = layers + (size_t)i * L_COUNT;
        norm(i == 0 ? residual : x, residual, (const void *)(intptr_t)l[L_IN_NORM], t, e, eps, hn,
             i != 0, threads);
        if ((rc = matmul(l, L_QKV, segs, hn, t, e, stride, qkv, tmp, es, threads))) break;
        rope(qkv, t, stride, h + kvh, d, cos, sin, threads);
        char *k_cache = (char *)(intptr_t)l[L_K_CACHE], *v_cache = (char *)(intptr_t)l[L_V_CACHE];
        if (dims[D_KV_INT8] ? ((store_q8_fn)(intptr_t)fns[F_STORE])(qkv, t, (long)(stride * es),
                                                                   (long)(q_size * es), kvh, d, (int)es,
                                                                   k_cache, v_cache, slots, cache_rows)
                            : store(qkv, t, (long)(stride * es), (long)(q_size * es), (long)(kv_size * es),
                                    k_cache, v_cache, slots, cache_rows)) {
            rc = -1;
            break;
        }
        for (size_t r = 0; r < (size_t)t; r++)  /* the q heads of each row, contiguous for the kernel */
            memcpy(q + r * q_size * es, qkv + r * stride * es, q_size * es);
        if (attn(q, (const void *)(intptr_t)l[L_K_CACHE], (const void *)(intptr_t)l[L_V_CACHE],
                 tables, lens, a, t, h, kvh, d, dims[D_BLOCK_SIZE], dims[D_MAX_BLOCKS], scale,
                 dims[D_WINDOW], threads)) {
            rc = -2;
            break;
        }
        if ((rc = matmul(l, L_O, segs, a, t, q_size, e, o, tmp, es, threads))) break;
        norm(o, residual, (const void *)(intptr_t)l[L_POST_NORM], t, e, eps, hn, 1, threads);
        if ((rc = matmul(l, L_GU, segs, hn, t, e, 2 * inter, gu, tmp, es, threads))) break;
        silu(gu, t, inter, act, threads);
        if ((rc = matmul(l, L_DOWN, segs, act, t, inter, e, x, tmp, es, threads))) break;
    }
    free(scratch);
    return rc > 0 ? 2 + rc : rc;
}
