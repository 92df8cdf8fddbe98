/* kv_quant: the reference quantization of KV windows (KIVI-style asymmetric min/max).
 *   - keys:   per channel over the window's tokens (one scale/zero per (KV head, channel)),
 *             stored pre-RoPE (the caller un-rotates Full keys before quantizing);
 *   - values: per token over groups of g channels (one scale/zero per (token, head, group));
 *   - scales and zero points are fp16; codes are packed little-end first (2 bits: 4 per byte,
 *     4 bits: 2 per byte, 8 bits: 1 per byte), in the element order of the fp32 input.
 * Guarantees: every element's reconstruction error is within scale/2 of its group (the fp16
 * zero is rounded down and the fp16 scale up so the group's range stays covered), and
 * re-quantizing dequantized values reproduces the same codes, scales and zeros exactly.
 * Pure functions: thread-safe. Shapes: a window is [omega][n_kv][head_dim] fp32.
 *
 * Precisely (L = 2^bits - 1; r = c * s + z is the fp32 reconstruction; see kv_quant.c):
 *   - inputs are sanitized first: NaN reads as 0, |x| > 65504 (and +-inf) saturates to +-65504;
 *     the bounds below hold against the sanitized value;
 *   - |x - r| <= s/2 + half an fp32 ulp of r (plus the fp32 rounding of (x - z) / s);
 *   - s >= 2^-14 (never an fp16 subnormal): a constant group of an fp16 value v gets z = v and
 *     reconstructs exactly; a group of range below L * 2^-14 may err by up to 2^-15;
 *   - z = the largest fp16 <= min and s = the smallest fp16 >= 2^-14 with fl(L*s + z) >= max,
 *     except when that pair would not survive re-quantization (the minimum's reconstruction
 *     crossing the next fp16 above z, possible only when the range is below about
 *     2 * L * ulp16(min)); then the first pair that does is used: z one fp16 step above min
 *     (within s/2) or up to two below, s ascending from (max - z) / (L + 1/2);
 *   - idempotence holds for every group for which such a pair exists; every group tried in
 *     the tests and in sweeps over all fp16 neighbourhoods had one. If none is found the first
 *     pair is kept: the error bound holds, a re-quantization may pick another (z, s). */
#ifndef QE_KV_QUANT_H
#define QE_KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int bits;  /* 2, 4 or 8 */
  int group; /* value channel group g (divides head_dim); default 32 */
  /* The frame the cache quantizes keys in (the functions below quantize what they are given):
   * KV_KEY_FRAME_POS, pre-RoPE (as DESIGN.md stores them; the default until 2026-12-01);
   * KV_KEY_FRAME_WINDOW, rotated by each token's offset inside its window (RoPE at
   * pos - window start), so that attention applies one rotation per window (the CPU tiered
   * cache only: an experiment); or
   * KV_KEY_FRAME_ABS, post-RoPE, as the Full pages hold them (KIVI quantizes the keys of its
   * cache so), so that attention over a quantized window needs no rotation at all: the GPU's
   * fast INT2 path (kern_cuda_attn.h), and the default of the quantizing policies (qevict,
   * kivi) since it measured no worse (README, "Key frames"). Per-channel statistics then
   * cover RoPE-mixed channel pairs, as the window frame's do within a window. */
  int key_frame;
} kv_qparams_t;
enum { KV_KEY_FRAME_POS = 0, KV_KEY_FRAME_WINDOW = 1, KV_KEY_FRAME_ABS = 2 };

/* Byte sizes of one window's quantized K or V: codes, and fp16 scales + zeros. */
typedef struct {
  size_t k_codes, k_meta; /* meta = scales + zeros, 2 * 2 bytes per (head, channel) */
  size_t v_codes, v_meta; /* 2 * 2 bytes per (token, head, group) */
} kv_qsizes_t;

/* Validates parameters against the geometry: QE_EINVAL with a detail line naming the field. */
int kv_qparams_check(const kv_qparams_t *p, int head_dim);
kv_qsizes_t kv_qsizes(const kv_qparams_t *p, int omega, int n_kv, int head_dim);

/* k [omega][n_kv][hd] -> codes [k_codes bytes], scale/zero [n_kv][hd] fp16. */
void kv_quant_keys(const kv_qparams_t *p, const float *k, int omega, int n_kv, int hd,
                   uint8_t *codes, uint16_t *scale, uint16_t *zero);
void kv_dequant_keys(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                     const uint16_t *zero, int omega, int n_kv, int hd, float *k);
/* v [omega][n_kv][hd] -> codes, scale/zero [omega][n_kv][hd/group] fp16. */
void kv_quant_values(const kv_qparams_t *p, const float *v, int omega, int n_kv, int hd,
                     uint8_t *codes, uint16_t *scale, uint16_t *zero);
void kv_dequant_values(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                       const uint16_t *zero, int omega, int n_kv, int hd, float *v);

/* The same two element by element (the reference kv_dequant_keys and kv_dequant_values give the
 * same bits as, a byte of codes at a time). */
void kv_dequant_keys_ref(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                         const uint16_t *zero, int omega, int n_kv, int hd, float *k);
void kv_dequant_values_ref(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                           const uint16_t *zero, int omega, int n_kv, int hd, float *v);

/* Channels [c0, c0 + nc) of KV head h's rows of a window's first n tokens ([n][nc], n <=
 * omega), the same bits as those elements of kv_dequant_keys and kv_dequant_values. */
void kv_dequant_keys_head(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                          const uint16_t *zero, int n, int n_kv, int hd, int h, int c0, int nc,
                          float *k);
void kv_dequant_values_head(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                            const uint16_t *zero, int n, int n_kv, int hd, int h, int c0, int nc,
                            float *v);

/* Reads element i (in [omega][n_kv][hd] order) of packed codes. */
static inline unsigned kv_code_at(const uint8_t *codes, size_t i, int bits) {
  int per = 8 / bits;
  return (codes[i / per] >> ((i % per) * bits)) & ((1u << bits) - 1);
}

#endif
