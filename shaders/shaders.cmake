# GLSL compute shaders of the Vulkan backend, compiled to SPIR-V with
# glslangValidator at build time and embedded in the plugin as C arrays
# (no shader file is needed at run time).
#
# Each entry is "<name>:<file>[:<define>]". A shader that uses subgroup
# operations is listed twice: once plain (the shared-memory fallback) and
# once with USE_SUBGROUP=1; the plugin picks the variant the device supports.
#
# A shader file not named in this list is found by glob (the shaders of an
# open op need no line here, <llmem/ops_impl.h> "Open ops"): it becomes one
# entry named after the file (gdn.comp -> "gdn", id VK_SH_GDN), or, when the
# file has lines "// llmem-shader: <name>[:<define>]", one entry per line.
# Included by backends/vulkan/CMakeLists.txt:
#   llmem_vulkan_shaders(<out_dir> <out_sources_var>)
# generates <out_dir>/vk_shader_ids.h (enum vk_shader_id) and
# <out_dir>/vk_shaders.c (the SPIR-V table) and returns the generated .c.

set(LLMEM_VK_SHADER_LIST
  "get_rows:get_rows.comp"
  "binary:binary.comp"
  "unary:unary.comp"
  "copy:copy.comp"
  "memcpy:memcpy.comp"
  "memcpy_w:memcpy.comp:UNIT_WORD=1"
  "argmax:argmax.comp"
  "sample:sample.comp"
  "sample_sg:sample.comp:USE_SUBGROUP=1"
  "rms_norm:rms_norm.comp"
  "rms_norm_sg:rms_norm.comp:USE_SUBGROUP=1"
  "rms_norm_gated:rms_norm_gated.comp"
  "rms_norm_gated_sg:rms_norm_gated.comp:USE_SUBGROUP=1"
  "log_softmax:log_softmax.comp"
  "log_softmax_sg:log_softmax.comp:USE_SUBGROUP=1"
  "matmul:matmul.comp"
  "matmul_rt:matmul_rt.comp"
  "sum_slices:sum_slices.comp"
  "matvec:matvec.comp"
  "matvec_sg:matvec.comp:USE_SUBGROUP=1"
  "matvec16:matvec16.comp"
  "rope:rope.comp"
  "rope_shift:rope_shift.comp"
  "kv_store:kv_store.comp"
  "kv_store_q:kv_store_q.comp"
  "attention_q:attention_q.comp"
  "ssm_scan_q:ssm_scan_q.comp"
  "attention:attention.comp"
  "attention_sg:attention.comp:USE_SUBGROUP=1"
  "attention_decode:attention_decode.comp"
  "attention_decode_sg:attention_decode.comp:USE_SUBGROUP=1"
  "attn_combine:attn_combine.comp"
  "ssm_conv:ssm_conv.comp"
  "ssm_scan:ssm_scan.comp"
  "ssm_scan_dec:ssm_scan_decode.comp"
  "ssm_scan_dec_sg:ssm_scan_decode.comp:USE_SUBGROUP=1"
  "state_gather:state_gather.comp"
  "attention_prefill_fa_emu:attention_prefill_fa.comp:EMU=1")

set(LLMEM_VK_SHADER_DIR ${CMAKE_CURRENT_LIST_DIR})

# The list above plus every shader file it does not name (see the top).
function(llmem_vulkan_shader_entries out_var)
  set(_entries ${LLMEM_VK_SHADER_LIST})
  set(_listed)
  foreach(entry ${LLMEM_VK_SHADER_LIST})
    string(REPLACE ":" ";" parts "${entry}")
    list(GET parts 1 file)
    list(APPEND _listed ${file})
  endforeach()
  file(GLOB _comps CONFIGURE_DEPENDS RELATIVE ${LLMEM_VK_SHADER_DIR} ${LLMEM_VK_SHADER_DIR}/*.comp)
  list(SORT _comps)
  foreach(file ${_comps})
    string(REGEX REPLACE "\\.comp$" "" _base ${file})
    if(file IN_LIST _listed OR _base IN_LIST LLMEM_VK_KHR_ONLY_SHADERS)
      continue()
    endif()
    # its entries may change with its text: configure again when it does
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${LLMEM_VK_SHADER_DIR}/${file})
    file(STRINGS ${LLMEM_VK_SHADER_DIR}/${file} _decl REGEX "^// llmem-shader: ")
    if(_decl)
      foreach(line ${_decl})
        if(NOT line MATCHES "^// llmem-shader: *([A-Za-z0-9_]+)(:([A-Za-z0-9_=]+))? *$")
          message(FATAL_ERROR "shaders/${file}: bad line '${line}' (want '// llmem-shader: <name>[:<define>]')")
        endif()
        set(name ${CMAKE_MATCH_1})
        set(def "${CMAKE_MATCH_3}")
        if(def)
          list(APPEND _entries "${name}:${file}:${def}")
        else()
          list(APPEND _entries "${name}:${file}")
        endif()
      endforeach()
    else()
      string(REGEX REPLACE "\\.comp$" "" name ${file})
      list(APPEND _entries "${name}:${file}")
    endif()
  endforeach()
  set(${out_var} ${_entries} PARENT_SCOPE)
endfunction()

# The KHR modules (llmem_vulkan_shaders): matmul_cmp.comp (prefill, above 64 rows),
# matmul_cm.comp (decode, 9-64 rows, the old plans), matmul_dec.comp (decode, 9-64 rows) and
# attention_prefill_cm.comp (fast-mode prefill attention; its -DEMU=1 entry, by the glob,
# is attention_prefill_emu).
set(LLMEM_VK_KHR_SHADERS
  "matmul_cmp"
  "matmul_cm"
  "matmul_dec"
  "attention_prefill_cm")
# KHR modules with no glslangValidator (Debian 12) entry at all, left out of the glob above:
# shaders on GL_NV_cooperative_matrix2, which glslang 15 compiles only for SPIR-V 1.6
# (--target-env vulkan1.3; the plugin asks for Vulkan 1.3 where it may run them).
# matmul_cm2.comp: the prefill GEMM on workgroup-scope matrices (above 64 rows).
# attention_prefill_fa.comp: the one-pass fast-mode prefill attention (its -DEMU=1 entry,
# attention_prefill_fa_emu, is listed in LLMEM_VK_SHADER_LIST above).
set(LLMEM_VK_KHR_ONLY_SHADERS
  "matmul_cm2"
  "attention_prefill_fa")
list(APPEND LLMEM_VK_KHR_SHADERS ${LLMEM_VK_KHR_ONLY_SHADERS})

# KHR modules compiled again with -DCM2=1 (GL_NV_cooperative_matrix2's row reductions and
# accumulator -> A conversions, SPIR-V 1.6): <name>.comp into the module <name>2_khr (id
# VK_SH_<NAME>2_KHR), embedded from shaders/khr/<name>2.spv while shaders/khr/<name>2.sha256
# matches <name>.comp. attention_prefill_cm.comp: the prefill attention with P in registers
# (backends/vulkan/vk_ops_attn_pf.c).
set(LLMEM_VK_CM2_VARIANTS
  "attention_prefill_cm")

# bf16 modules (VK_KHR_shader_bfloat16, GL_EXT_bfloat16: glslang 16 or later, Debian sid's;
# tools/glslang_khr.sh with LLMEM_GLSLANG_SUITE=sid): <name>.comp compiled with -DKHR
# -DBF16=1 into the module <name>_bf_khr (id VK_SH_<NAME>_BF_KHR), embedded from
# shaders/khr/<name>_bf.spv while shaders/khr/<name>_bf.sha256 matches <name>.comp (or
# compiled by ${LLMEM_GLSLANG_BF16} when set). matmul_dec.comp and matmul_cm.comp: the
# fast-mode decode GEMMs on bf16 matrices (backends/vulkan/vk_ops_matmul.c, vk_bf16_used).
set(LLMEM_VK_BF16_SHADERS
  "matmul_dec"
  "matmul_cm")

# <out_dir>/spv/<mod>.h for a module of <name>.comp compiled with `defines` (a list) by the
# command line in the variable named by `compiler_var` when that is set, else embedded from
# shaders/khr/<spv>.spv while shaders/khr/<spv>.sha256 holds <name>.comp's SHA-256 (else an
# empty module: the plugin keeps the other paths); its path in <hdr_var>.
function(llmem_vulkan_khr_module_as name mod spv compiler_var defines out_dir hdr_var)
  set(hdr ${out_dir}/spv/${mod}.h)
  set(_khr_comp ${LLMEM_VK_SHADER_DIR}/${name}.comp)
  set(_khr_spv ${LLMEM_VK_SHADER_DIR}/khr/${spv}.spv)
  set(_khr_sha ${LLMEM_VK_SHADER_DIR}/khr/${spv}.sha256)
  if(${compiler_var})
    file(GLOB _includes ${LLMEM_VK_SHADER_DIR}/*.glsl)
    separate_arguments(_gk UNIX_COMMAND "${${compiler_var}}")
    set(_env vulkan1.2)
    if(name IN_LIST LLMEM_VK_KHR_ONLY_SHADERS OR "-DCM2=1" IN_LIST defines)
      set(_env vulkan1.3)
    endif()
    add_custom_command(
      OUTPUT ${hdr}
      COMMAND ${_gk} -V -g0 --target-env ${_env} ${defines} -I${LLMEM_VK_SHADER_DIR}
              --vn vk_spv_${mod} -o ${hdr} ${_khr_comp}
      DEPENDS ${_khr_comp} ${_includes}
      COMMENT "glslang (${spv}) ${name}.comp -> ${mod}"
      VERBATIM)
  else()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_khr_comp} ${_khr_spv} ${_khr_sha})
    file(SHA256 ${_khr_comp} _have)
    set(_want "")
    if(EXISTS ${_khr_sha})
      file(STRINGS ${_khr_sha} _want LIMIT_COUNT 1)
    endif()
    if(EXISTS ${_khr_spv} AND _have STREQUAL _want)
      file(READ ${_khr_spv} _hex HEX)
      string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," _words "${_hex}")
      set(_khr_text "const uint32_t vk_spv_${mod}[] = {${_words}};\n")
    else()
      message(WARNING "shaders/khr/${spv}.spv does not match shaders/${name}.comp "
                      "(run shaders/khr/update.sh): its module ${mod} is left out")
      set(_khr_text "const uint32_t vk_spv_${mod}[] = {0u}; /* none: stale */\n")
    endif()
    file(WRITE ${hdr}.in "/* shaders/khr/${spv}.spv (shaders/shaders.cmake) */\n#pragma once\n${_khr_text}")
    configure_file(${hdr}.in ${hdr} COPYONLY)
  endif()
  set(${hdr_var} ${hdr} PARENT_SCOPE)
endfunction()

# <out_dir>/spv/<name>_khr.h for the KHR module of <name>.comp (see llmem_vulkan_shaders);
# its path in <hdr_var>.
function(llmem_vulkan_khr_module name out_dir hdr_var)
  llmem_vulkan_khr_module_as(${name} ${name}_khr ${name} LLMEM_GLSLANG_KHR "-DKHR" ${out_dir} _h)
  set(${hdr_var} ${_h} PARENT_SCOPE)
endfunction()

# One embedded module `mod` (header hdr, array vk_spv_<mod>): its id VK_SH_<MOD>, its
# #include and its vk_shader_codes entry, appended to llmem_vulkan_shaders' _headers, _enum,
# _incl and _table (a macro: it writes the caller's variables).
macro(llmem_vulkan_shader_slot mod hdr)
  list(APPEND _headers ${hdr})
  string(TOUPPER ${mod} _up)
  string(APPEND _enum "    VK_SH_${_up},\n")
  string(APPEND _incl "#include \"spv/${mod}.h\"\n")
  string(APPEND _table "    {\"${mod}\", vk_spv_${mod}, sizeof vk_spv_${mod}},\n")
endmacro()

function(llmem_vulkan_shaders out_dir out_sources)
  llmem_vulkan_shader_entries(_all_entries)
  file(GLOB _includes ${LLMEM_VK_SHADER_DIR}/*.glsl)
  file(MAKE_DIRECTORY ${out_dir}/spv)
  set(_headers)
  set(_enum "")
  set(_incl "")
  set(_table "")
  foreach(entry ${_all_entries})
    string(REPLACE ":" ";" parts "${entry}")
    list(GET parts 0 name)
    list(GET parts 1 file)
    list(LENGTH parts n)
    set(defs)
    if(n GREATER 2)
      list(GET parts 2 d)
      set(defs -D${d})
    endif()
    set(hdr ${out_dir}/spv/${name}.h)
    add_custom_command(
      OUTPUT ${hdr}
      COMMAND ${GLSLANG_VALIDATOR} -V --target-env vulkan1.1 ${defs}
              -I${LLMEM_VK_SHADER_DIR} --vn vk_spv_${name} -o ${hdr}
              ${LLMEM_VK_SHADER_DIR}/${file}
      DEPENDS ${LLMEM_VK_SHADER_DIR}/${file} ${_includes}
      COMMENT "glslangValidator ${file} -> ${name}"
      VERBATIM)
    llmem_vulkan_shader_slot(${name} ${hdr})
  endforeach()
  # Shaders on GL_KHR_cooperative_matrix (-DKHR), which needs glslang 15 or later (Debian 12
  # has 12): each name in LLMEM_VK_KHR_SHADERS (<name>.comp, self-contained: it includes
  # nothing) becomes the module <name>_khr (id VK_SH_<NAME>_KHR), compiled by
  # ${LLMEM_GLSLANG_KHR} when set (e.g. tools/glslang_khr.sh), else the SPIR-V that
  # shaders/khr/update.sh made with it, embedded only while shaders/khr/<name>.sha256 matches
  # <name>.comp, so a stale module never runs; otherwise an empty module, and the plugin keeps
  # the NV path (matmul_cm.comp).
  foreach(kname ${LLMEM_VK_KHR_SHADERS})
    llmem_vulkan_khr_module(${kname} ${out_dir} _khr_hdr)
    llmem_vulkan_shader_slot(${kname}_khr ${_khr_hdr})
  endforeach()
  foreach(cname ${LLMEM_VK_CM2_VARIANTS})
    llmem_vulkan_khr_module_as(${cname} ${cname}2_khr ${cname}2 LLMEM_GLSLANG_KHR
                               "-DKHR;-DCM2=1" ${out_dir} _cm2_hdr)
    llmem_vulkan_shader_slot(${cname}2_khr ${_cm2_hdr})
  endforeach()
  foreach(bname ${LLMEM_VK_BF16_SHADERS})
    llmem_vulkan_khr_module_as(${bname} ${bname}_bf_khr ${bname}_bf LLMEM_GLSLANG_BF16
                               "-DKHR;-DBF16=1" ${out_dir} _bf_hdr)
    llmem_vulkan_shader_slot(${bname}_bf_khr ${_bf_hdr})
  endforeach()
  file(WRITE ${out_dir}/vk_shader_ids.h.in
    "/* Generated by shaders/shaders.cmake: one id per embedded SPIR-V module. */\n"
    "#ifndef LLMEM_VK_SHADER_IDS_H\n#define LLMEM_VK_SHADER_IDS_H\n#include <stddef.h>\n#include <stdint.h>\n"
    "typedef enum vk_shader_id {\n${_enum}    VK_SH_COUNT\n} vk_shader_id;\n"
    "typedef struct vk_shader_code {\n    const char *name;\n    const uint32_t *code;\n    size_t size; /* bytes */\n} vk_shader_code;\n"
    "extern const vk_shader_code vk_shader_codes[VK_SH_COUNT];\n#endif\n")
  file(WRITE ${out_dir}/vk_shaders.c.in
    "/* Generated by shaders/shaders.cmake: the embedded SPIR-V modules. */\n"
    "#include \"vk_shader_ids.h\"\n${_incl}"
    "const vk_shader_code vk_shader_codes[VK_SH_COUNT] = {\n${_table}};\n")
  configure_file(${out_dir}/vk_shader_ids.h.in ${out_dir}/vk_shader_ids.h COPYONLY)
  configure_file(${out_dir}/vk_shaders.c.in ${out_dir}/vk_shaders.c COPYONLY)
  set_source_files_properties(${out_dir}/vk_shaders.c PROPERTIES OBJECT_DEPENDS "${_headers}")
  add_custom_target(llmem_vulkan_spirv DEPENDS ${_headers})
  set(${out_sources} ${out_dir}/vk_shaders.c PARENT_SCOPE)
endfunction()
