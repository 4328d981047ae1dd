#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "cm_api.glsl"
/* As mma.comp, but the fragments are loaded from shared memory (40-half
 * rows, as matmul_cm.comp's) in every round, and BARK adds a barrier every
 * BAREVERY rounds: 1 barrier(), 2 subgroup-scope controlBarrier, 3 a
 * workgroup controlBarrier without memory semantics, 4 barrier + a shared
 * store + barrier. 16 x 16 x 16 only. */
#ifndef BARK
#define BARK 0
#define BAREVERY 1u
#endif
layout(local_size_x = 128) in;
layout(binding = 0) buffer H { uvec4 h[]; };
layout(binding = 1) buffer F { float f[]; };
layout(binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P { uint iters; } p;
shared uvec4 sh[64 * 5 * 2];
void main()
{
    uint l = gl_LocalInvocationID.x;
    for (uint i = l; i < 640u; i += 128u) sh[i] = h[i % 512u];
    barrier();
    MC c[NA * NB];
    [[unroll]] for (uint i = 0; i < NA * NB; i++) c[i] = MC(0.0);
    for (uint it = 0; it < p.iters; it++) {
        MA a[NA]; MB b[NB];
        uint o_ = (it & 1u) * 2u;
        [[unroll]] for (uint j = 0; j < NB; j++) LOADC(b[j], sh, 320u + 16u * 5u * (j % 4u) + o_, 5u);
        [[unroll]] for (uint i = 0; i < NA; i++) LOADR(a[i], sh, 16u * 5u * (i % 4u) + o_, 5u);
        [[unroll]] for (uint i = 0; i < NA; i++)
            [[unroll]] for (uint j = 0; j < NB; j++)
                c[i * NB + j] = MMA(a[i], b[j], c[i * NB + j]);
#if BARK == 1
        if ((it % BAREVERY) == 0u) barrier();
#elif BARK == 2
        if ((it % BAREVERY) == 0u) controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
#elif BARK == 3
        if ((it % BAREVERY) == 0u) controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, 0, 0);
#elif BARK == 4
        if ((it % BAREVERY) == 0u) { barrier(); sh[l] = h[l + it % 7u]; barrier(); }
#endif
    }
    MC s = c[0];
    [[unroll]] for (uint i = 1; i < NA * NB; i++) s += c[i];
    uint sg = gl_WorkGroupID.x * 4u + l / 32u;
    STORER(s, o, (sg % 1024u) * 256u, 16u);
}
