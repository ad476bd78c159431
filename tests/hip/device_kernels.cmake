# ctest's check that kernels_amd.o holds AMD device code for every kernel it names, for each target: the
# offload bundle is taken out of the object (objcopy), unbundled per target (clang-offload-bundler), and
# its kernel descriptors (symbols ending .kd) counted. A table the compiler dropped compiles as well, with
# no device code at all, so the build alone cannot tell.
# cmake -DOBJECT=kernels_amd.o -DSOURCE=kernels_amd.hip -DTARGETS=gfx90a;gfx940 -DOBJCOPY=... -DBUNDLER=... -DNM=... -DWORK=dir -P
file(STRINGS ${SOURCE} named REGEX "reinterpret_cast<const void\\*>\\(&k::")
list(LENGTH named expected)
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${OBJCOPY} -O binary --only-section=.hip_fatbin ${OBJECT} ${WORK}/bundle.bin RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${OBJECT} has no .hip_fatbin section: no device code at all")
endif()
foreach(target IN LISTS TARGETS)
  execute_process(COMMAND ${BUNDLER} --unbundle --type=o --input=${WORK}/bundle.bin
                          --targets=hipv4-amdgcn-amd-amdhsa--${target} --output=${WORK}/${target}.co RESULT_VARIABLE rc)
  execute_process(COMMAND ${NM} ${WORK}/${target}.co OUTPUT_VARIABLE symbols RESULT_VARIABLE nm_rc)
  string(REGEX MATCHALL "[^\n]*kernels[^\n]*\\.kd\n" kernels "${symbols}")
  list(LENGTH kernels found)
  if(NOT rc EQUAL 0 OR NOT nm_rc EQUAL 0 OR NOT found EQUAL expected)
    message(FATAL_ERROR "${target}: ${found} of the ${expected} kernels kernels_amd.hip names are in its device code")
  endif()
  message(STATUS "${target}: all ${found} kernels in device code")
endforeach()
