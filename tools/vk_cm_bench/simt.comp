#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
/* f32 (HALF 0) or packed f16 (HALF 1) FMA throughput: 8 independent
 * vec4 chains per invocation (vk_cm_bench "simt" entries, 64 flops per
 * invocation and round). */
layout(local_size_x = 128) in;
layout(binding = 0) buffer H { float16_t h[]; };
layout(binding = 1) buffer F { float f[]; };
layout(binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P { uint iters; } p;
#if HALF
#define V f16vec4
#else
#define V vec4
#endif
void main()
{
    uint l = gl_LocalInvocationID.x;
    V x = V(f[l % 64u]), y = V(f[64u + l % 64u]);
    V v[8];
    [[unroll]] for (uint i = 0; i < 8; i++) v[i] = V(f[128u + i]);
    for (uint it = 0; it < p.iters; it++)
        [[unroll]] for (uint i = 0; i < 8; i++) v[i] = fma(v[i], x, y);
    V s = v[0];
    [[unroll]] for (uint i = 1; i < 8; i++) s += v[i];
    o[(gl_GlobalInvocationID.x % 65536u)] = float(s.x + s.y + s.z + s.w);
}
