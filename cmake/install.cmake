# Installs flashcos::attention: the shared library, its public headers and a CMake package, so
# that a consumer writes
#   find_package(flashcos REQUIRED)          # finds Torch itself
#   target_link_libraries(app PRIVATE flashcos::attention)
include(CMakePackageConfigHelpers)
set(FLASHCOS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashcos)

install(TARGETS flashcos_attention EXPORT flashcosTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/attention/include/flashcos DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT flashcosTargets NAMESPACE flashcos:: DESTINATION ${FLASHCOS_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flashcosConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flashcosConfig.cmake INSTALL_DESTINATION ${FLASHCOS_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashcosConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashcosConfig.cmake ${PROJECT_BINARY_DIR}/flashcosConfigVersion.cmake
  DESTINATION ${FLASHCOS_CMAKE_DIR})
