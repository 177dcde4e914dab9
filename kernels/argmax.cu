// Argmax and confidence over a model's output on the device, so only labels and confidence come
// back to the host. scores: [n][k][pixels] (a dense twin's n x K x H x W, or a patch model's
// n x K with pixels = 1). One thread per (n, pixel).
//   class[i] = the first c with the largest score (UINT_MAX when any score is not finite)
//   conf[i]  = logits: the softmax of the top class, 1 / sum_c exp(s_c - top); probabilities: top;
//              NaN when any score is not finite.
extern "C" __global__ void argmax_confidence(const float* scores, int n, int k, int pixels, int logits,
                                             unsigned int* cls, float* conf) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * pixels) return;
    long long img = i / pixels;
    long long px = i % pixels;
    const float* s = scores + img * (long long)k * pixels + px;
    float top = s[0];
    unsigned int best = 0;
    bool finite = isfinite(top);
    for (int c = 1; c < k; ++c) {
        float v = s[(long long)c * pixels];
        finite = finite && isfinite(v);
        if (v > top) {
            top = v;
            best = c;
        }
    }
    if (!finite) {
        cls[i] = 0xffffffffu;
        conf[i] = __int_as_float(0x7fc00000);
        return;
    }
    float c;
    if (logits) {
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += expf(s[(long long)j * pixels] - top);
        c = 1.0f / sum;
    } else {
        c = top;
    }
    cls[i] = best;
    conf[i] = c;
}
