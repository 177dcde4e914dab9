// Raw sensor tile -> normalised planar float32 in the model's input layout (n1chw / nchw: band,
// line, sample), written straight into the bound input on the device:
//   out[b][y][x] = (raw(y, x, b) - mean[b]) * inv_std[b]
// interleave: 0 BSQ (band, line, sample), 1 BIL (line, band, sample), 2 BIP (line, sample, band).
// swap: the file's byte order differs from the device's (ENVI `byte order = 1`).
// One thread per output value; consecutive threads write consecutive samples of one band row.

template <typename T>
__device__ __forceinline__ T swap_bytes(T v);

template <>
__device__ __forceinline__ short swap_bytes<short>(short v) {
    unsigned short u = (unsigned short)v;
    return (short)((u >> 8) | (u << 8));
}

template <>
__device__ __forceinline__ unsigned short swap_bytes<unsigned short>(unsigned short v) {
    return (unsigned short)((v >> 8) | (v << 8));
}

template <>
__device__ __forceinline__ float swap_bytes<float>(float v) {
    return __int_as_float(__byte_perm(__float_as_int(v), 0, 0x0123));
}

// Offset of band b, line y, sample x in a block `lines` x `samples` x `bands` stored in `interleave`.
__device__ __forceinline__ long long raw_index(int interleave, int b, int y, int x, int lines, int samples,
                                               int bands) {
    if (interleave == 0) return ((long long)b * lines + y) * samples + x;
    if (interleave == 1) return ((long long)y * bands + b) * samples + x;
    return ((long long)y * samples + x) * bands + b;
}

template <typename T>
__device__ __forceinline__ void preprocess(const T* raw, int interleave, int swap, int lines, int samples,
                                           int bands, const float* mean, const float* inv_std, float* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)lines * samples * bands;
    if (i >= n) return;
    int x = (int)(i % samples);
    long long t = i / samples;
    int y = (int)(t % lines);
    int b = (int)(t / lines);
    T v = raw[raw_index(interleave, b, y, x, lines, samples, bands)];
    if (swap) v = swap_bytes<T>(v);
    out[i] = ((float)v - mean[b]) * inv_std[b];
}

extern "C" __global__ void preprocess_i16(const short* raw, int interleave, int swap, int lines, int samples,
                                          int bands, const float* mean, const float* inv_std, float* out) {
    preprocess<short>(raw, interleave, swap, lines, samples, bands, mean, inv_std, out);
}

extern "C" __global__ void preprocess_u16(const unsigned short* raw, int interleave, int swap, int lines,
                                          int samples, int bands, const float* mean, const float* inv_std,
                                          float* out) {
    preprocess<unsigned short>(raw, interleave, swap, lines, samples, bands, mean, inv_std, out);
}

extern "C" __global__ void preprocess_f32(const float* raw, int interleave, int swap, int lines, int samples,
                                          int bands, const float* mean, const float* inv_std, float* out) {
    preprocess<float>(raw, interleave, swap, lines, samples, bands, mean, inv_std, out);
}

// The same from a box of the file read straight from the mapped scene: `raw` holds scene lines
// l0 .. l0 + box_lines and samples c0 .. c0 + box_samples in the file's interleave, and output
// window line y, sample x reads scene line lines[y], sample cols[x] (the tile grid's window indices,
// its reflections at the scene's borders included), all inside the box.
template <typename T>
__device__ __forceinline__ void preprocess_box(const T* raw, int interleave, int swap, int box_lines,
                                               int box_samples, int bands, const int* lines, const int* cols,
                                               int l0, int c0, int wh, int ww, const float* mean,
                                               const float* inv_std, float* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)wh * ww * bands;
    if (i >= n) return;
    int x = (int)(i % ww);
    long long t = i / ww;
    int y = (int)(t % wh);
    int b = (int)(t / wh);
    int sy = lines[y] - l0;
    int sx = cols[x] - c0;
    T v = raw[raw_index(interleave, b, sy, sx, box_lines, box_samples, bands)];
    if (swap) v = swap_bytes<T>(v);
    out[i] = ((float)v - mean[b]) * inv_std[b];
}

#define PREPROCESS_BOX(name, T)                                                                                 \
    extern "C" __global__ void name(const T* raw, int interleave, int swap, int box_lines, int box_samples,     \
                                    int bands, const int* lines, const int* cols, int l0, int c0, int wh, int ww, \
                                    const float* mean, const float* inv_std, float* out) {                       \
        preprocess_box<T>(raw, interleave, swap, box_lines, box_samples, bands, lines, cols, l0, c0, wh, ww,     \
                          mean, inv_std, out);                                                                   \
    }

PREPROCESS_BOX(preprocess_box_i16, short)
PREPROCESS_BOX(preprocess_box_u16, unsigned short)
PREPROCESS_BOX(preprocess_box_f32, float)

// Patch mode on the device: the p x p patches of `n` consecutive output pixels of one tile, read
// from its normalised planar window (bands x wh x ww), written as the model's [n][bands][p][p]
// input. Output pixel q of the tile (row-major over a tile `tw` wide) has its patch's top-left
// corner at window (q / tw, q % tw); the window carries the halo, so every patch lies inside it.
// One thread per output value.
extern "C" __global__ void gather_patches(const float* window, int bands, int wh, int ww, int p, int tw,
                                          int first, int n, float* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per = (long long)bands * p * p;
    if (i >= (long long)n * per) return;
    int q = first + (int)(i / per);
    long long r = i % per;
    int b = (int)(r / (p * p));
    int dy = (int)((r / p) % p);
    int dx = (int)(r % p);
    int y = q / tw + dy;
    int x = q % tw + dx;
    out[i] = window[((long long)b * wh + y) * ww + x];
}
