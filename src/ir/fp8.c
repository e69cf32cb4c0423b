/* FP8 codes <-> f32, exact. Two OCP formats, one byte each:
 *   e4m3 ("e4m3fn"): bias 7, max finite 448, no infinities, NaN = S.1111.111;
 *   e5m2:            bias 15, max finite 57344, IEEE-like: S.11111.00 = inf, S.11111.{01,10,11} = NaN.
 * The encoder rounds to nearest, ties to even, subnormals included, and SATURATES: a finite value or an
 * infinity beyond the largest finite code gives that code (±max), as Transformer Engine and torchao cast.
 * NaN stays NaN with its sign: the canonical code S.1111111 (0x7f / 0xff) in both formats. */
#include "ir/ir.h"

#include <math.h>
#include <string.h>

typedef struct fp8_format {
  int mbits;      /* mantissa bits */
  int emin;       /* unbiased exponent of the smallest normal: 1 - bias */
  int bias;
  uint8_t maxc;   /* code of the largest finite value */
  float max;
} fp8_format;

static const fp8_format E4M3 = {3, -6, 7, 0x7e, 448.0f};
static const fp8_format E5M2 = {2, -14, 15, 0x7b, 57344.0f};

static const fp8_format *format_of(evt_dtype dt) { return dt == EVT_F8E5M2 ? &E5M2 : &E4M3; }

/* |x| (not NaN) as a 7-bit code, saturating. The quantum of x's binade (clamped to the subnormal one) makes
 * a / quantum an exact float whose RNE integer q is the significand; (e - emin) << mbits + q carries into
 * the exponent when q reaches 2^(mbits+1), and is q itself for subnormals. */
static uint8_t encode_magnitude(const fp8_format *f, float a) {
  if (!(a < f->max)) return f->maxc; /* also +inf */
  if (a == 0.0f) return 0;
  int e;
  frexpf(a, &e);
  e -= 1; /* a = 1.x * 2^e */
  if (e < f->emin) e = f->emin;
  float q = nearbyintf(ldexpf(a, f->mbits - e)); /* default rounding mode: nearest even */
  return (uint8_t)(((e - f->emin) << f->mbits) + (int)q);
}

uint8_t evt_fp8_from_f32(float x, evt_dtype fmt) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (isnan(x)) return sign | 0x7f;
  return sign | encode_magnitude(format_of(fmt), fabsf(x));
}

float evt_fp8_to_f32(uint8_t code, evt_dtype fmt) {
  const fp8_format *f = format_of(fmt);
  int ebits = 7 - f->mbits, exp = (code & 0x7f) >> f->mbits, man = code & ((1 << f->mbits) - 1);
  float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (fmt == EVT_F8E4M3 && (code & 0x7f) == 0x7f) return copysignf(NAN, sign);
  if (fmt == EVT_F8E5M2 && exp == (1 << ebits) - 1) return man ? copysignf(NAN, sign) : sign * INFINITY;
  if (exp == 0) return sign * ldexpf((float)man, f->emin - f->mbits);
  return sign * ldexpf((float)((1 << f->mbits) + man), exp - f->bias - f->mbits);
}

float evt_round_fp8(float x, evt_dtype fmt) { return evt_fp8_to_f32(evt_fp8_from_f32(x, fmt), fmt); }
