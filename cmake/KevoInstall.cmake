include(CMakePackageConfigHelpers)
set(KEVO_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/cmake/kevo)

install(TARGETS kevo_core kevo_retrieval kevo_llm kevo_sqlite kevo_jail kevo_retrieval_cuda kevo_hip kevo kevo_cuda EXPORT kevoTargets)
# kevo::postgres where libpq was found: a consumer's find_package(kevo) then looks for libpq too.
if(TARGET kevo_postgres)
  install(TARGETS kevo_postgres EXPORT kevoTargets)
  set(KEVO_CONFIG_WITH_POSTGRES ON)
else()
  set(KEVO_CONFIG_WITH_POSTGRES OFF)
endif()
install(DIRECTORY include/kevo DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY knowledge DESTINATION ${CMAKE_INSTALL_DATADIR}/kevo OPTIONAL)
install(DIRECTORY problems DESTINATION ${CMAKE_INSTALL_DATADIR}/kevo)
install(EXPORT kevoTargets NAMESPACE kevo:: DESTINATION ${KEVO_CMAKE_DIR})

# Whether kevo::retrieval_cuda was built with the toolkit (and so names CUDA::cudart), for kevoConfig.cmake.
if(KEVO_HAVE_CUDA)
  set(KEVO_CONFIG_WITH_CUDA ON)
else()
  set(KEVO_CONFIG_WITH_CUDA OFF)
endif()
configure_package_config_file(cmake/kevoConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kevoConfig.cmake INSTALL_DESTINATION ${KEVO_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kevoConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kevoConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/kevoConfigVersion.cmake
  DESTINATION ${KEVO_CMAKE_DIR})
