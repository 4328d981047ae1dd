/* llmem CUDA kernels: Mamba-2 selective scan with an int8 SSM state and a
 * per-head scale (issue 17; <llmem/view.h> llmem_state_slot_bytes: a slot
 * is its [H][P][N] int8 codes, then H f32 scales at the next 16-byte
 * boundary; value = code * scale).
 *
 * One CTA per (stream, head) holds the head's whole state in shared memory
 * as f32 (so the scale of a stored state, amax / 127 over the head, is one
 * block reduction): it dequantizes its source, runs the recurrence of
 * ops.h's llmem_op_ssm_scan (Dao & Gu 2024, Sec. 3; HF Mamba2Mixer
 * torch_forward single-step path) token by token, one warp per state row,
 * and quantizes every state it stores (checkpoints, the snapshot inside
 * the ubatch, dst): codes rintf(x / scale) clamped to [-127, 127], the cpu
 * backend's arithmetic. When a stream reads a slot another stream writes
 * (copy-on-write), the caller passes raw copies of every source slot
 * (snap). */
#include "kernels/common.cuh"
#include "kernels/attention_q.h"

#define SQ_WARPS 8

__device__ float sq_block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < SQ_WARPS; w++)
        r = fmaxf(r, red[w]);
    return r;
}

__global__ void __launch_bounds__(SQ_WARPS * 32)
    ssm_scan_q_kernel(cuk_scan_args p, cuk_scan_q_args q)
{
    extern __shared__ float sq_S[];
    __shared__ float red[SQ_WARPS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t H = p.n_heads, P = p.head_dim, N = p.d_state, G = p.n_groups;
    int64_t s = blockIdx.x / H;
    int32_t h = (int32_t)(blockIdx.x % H), g = h / (H / G);
    int32_t hs = P * N;
    const uint8_t *src = nullptr;
    if (q.snap) {
        src = q.snap + (size_t)s * q.slot_bytes;
    } else {
        int32_t sl = q.src[s];
        if (sl >= 0 && sl < q.n_slots)
            src = q.state + (size_t)sl * q.slot_bytes;
    }
    float sc = src ? *(const float *)(src + q.scale_off + 4 * (size_t)h) : 0.0f;
    for (int32_t i = threadIdx.x; i < hs; i += blockDim.x)
        sq_S[i] = src ? (float)(int8_t)src[(size_t)h * hs + i] * sc : 0.0f;
    __syncthreads();
    float A = -expf(cuk_load(p.a_log, p.a_dt, h));
    float Dh = cuk_param(p.d, p.d_dt, h, 0.0f);
    float bias = cuk_param(p.dt_bias, p.b_dt, h, 0.0f);
    auto store_state = [&](int32_t sl) {
        if (sl < 0 || sl >= q.n_slots)
            return;
        float a = 0.0f;
        for (int32_t i = threadIdx.x; i < hs; i += blockDim.x)
            a = fmaxf(a, fabsf(sq_S[i]));
        a = sq_block_max(a, red);
        float scale = __fdiv_rn(a, 127.0f);
        uint8_t *dst = q.state + (size_t)sl * q.slot_bytes;
        for (int32_t i = threadIdx.x; i < hs; i += blockDim.x) {
            float r = scale > 0.0f ? rintf(__fdiv_rn(sq_S[i], scale)) : 0.0f;
            r = r != r ? 0.0f : fminf(fmaxf(r, -127.0f), 127.0f);
            dst[(size_t)h * hs + i] = (uint8_t)(int8_t)r;
        }
        if (threadIdx.x == 0)
            *(float *)(dst + q.scale_off + 4 * (size_t)h) = scale;
        __syncthreads();
    };
    int32_t n_tok = q.n_seq_tokens, n_ckpt = q.n_ckpt;
    for (int32_t c = 0; c < n_ckpt; c++)
        if (n_tok - n_ckpt + c == -1)
            store_state(q.ckpt[s * n_ckpt + c]);
    int32_t snap_t = -1, snap_sl = q.snap_slot ? q.snap_slot[s] : -1;
    if (snap_sl >= 0) {
        snap_t = q.snap_tok[s];
        snap_t = snap_t >= 0 && snap_t < n_tok - 1 ? snap_t : -1;
    }
    int64_t d_inner = (int64_t)H * P;
    for (int32_t t = 0; t < n_tok; t++) {
        int64_t tok = s * n_tok + t;
        const float *row = p.xbc + tok * p.conv_dim;
        float v = p.dt[tok * H + h] + bias;
        float dtv = v > 20.0f ? v : log1pf(expf(v));
        dtv = dtv < p.dt_min ? p.dt_min : dtv;
        dtv = dtv > p.dt_max ? p.dt_max : dtv;
        float dA = expf(dtv * A);
        const float *B = row + d_inner + (int64_t)g * N;
        const float *C = row + d_inner + (int64_t)G * N + (int64_t)g * N;
        for (int32_t pp = warp; pp < P; pp += SQ_WARPS) {
            float xv = row[(int64_t)h * P + pp];
            float coef = xv * dtv, acc = 0.0f;
            float *Sp = sq_S + (size_t)pp * N;
            for (int32_t n = lane; n < N; n += 32) {
                float x = Sp[n] * dA + coef * B[n];
                Sp[n] = x;
                acc += x * C[n];
            }
            acc = cuk_warp_sum(acc);
            if (lane == 0)
                p.y[tok * d_inner + (int64_t)h * P + pp] = acc + Dh * xv;
        }
        __syncthreads();
        for (int32_t c = 0; c < n_ckpt; c++)
            if (n_tok - n_ckpt + c == t)
                store_state(q.ckpt[s * n_ckpt + c]);
        if (t == snap_t) /* the snapshot inside the ubatch */
            store_state(snap_sl);
    }
    store_state(q.dst[s]);
}

extern "C" cudaError_t cuk_ssm_scan_q(const cuk_scan_args *p, const cuk_scan_q_args *q,
                                      cudaStream_t stream)
{
    size_t smem = (size_t)p->head_dim * p->d_state * sizeof(float);
    if (smem > 48 * 1024)
        return cudaErrorInvalidValue;
    int64_t items = (int64_t)q->n_seqs * p->n_heads;
    if (items == 0)
        return cudaSuccess;
    ssm_scan_q_kernel<<<(unsigned)items, SQ_WARPS * 32, smem, stream>>>(*p, *q);
    return cudaGetLastError();
}
