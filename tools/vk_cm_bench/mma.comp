#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "cm_api.glsl"
/* Throughput of the cooperative-matrix multiply-add alone (vk_cm_bench
 * "mma" entries): each subgroup loads NA A and NB B fragments (TM x TK,
 * TK x TN, f16) once from binding 0, then runs p.iters rounds of the
 * NA x NB independent multiply-adds into f32 (CF16 1: f16) accumulators,
 * and stores their sum. -DKHR: GL_KHR_cooperative_matrix (glslang 15+),
 * else GL_NV_cooperative_matrix (glslang 12). */
layout(local_size_x = 128) in;
layout(binding = 0) buffer H { float16_t h[]; };
layout(binding = 1) buffer F { float f[]; };
#if CF16
layout(binding = 2) buffer O { float16_t o[]; };
#else
layout(binding = 2) buffer O { float o[]; };
#endif
layout(push_constant) uniform P { uint iters; } p;
void main()
{
    MA a[NA];
    MB b[NB];
    MC c[NA * NB];
    [[unroll]] for (uint i = 0; i < NA; i++) LOADR(a[i], h, 256u * i, TK);
    [[unroll]] for (uint j = 0; j < NB; j++) LOADR(b[j], h, 4096u + 256u * j, TN);
    [[unroll]] for (uint i = 0; i < NA * NB; i++) c[i] = MC(0.0);
    for (uint it = 0; it < p.iters; it++) {
        [[unroll]] for (uint i = 0; i < NA; i++)
            [[unroll]] for (uint j = 0; j < NB; j++)
                c[i * NB + j] = MMA(a[i], b[j], c[i * NB + j]);
    }
    MC s = c[0];
    [[unroll]] for (uint i = 1; i < NA * NB; i++) s += c[i];
    uint sg = gl_WorkGroupID.x * 4u + gl_LocalInvocationID.x / 32u;
    STORER(s, o, (sg % 1024u) * (TM * TN), TN);
}
