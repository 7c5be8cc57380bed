# Install rules and the CMake package: `cmake --install BUILD --prefix P`, then in another project
#   find_package(Renaissance REQUIRED)
#   target_link_libraries(app PRIVATE Renaissance::renaissance)
# (examples/CMakeLists.txt is such a project; ctest's install_find_package builds it.)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Renaissance)
set(RN_INSTALLED_TARGETS renaissance renaissance_core renaissance_cpu)
if(RENAISSANCE_WITH_CUDA)
  list(APPEND RN_INSTALLED_TARGETS renaissance_cuda)
endif()
install(TARGETS ${RN_INSTALLED_TARGETS} EXPORT RenaissanceTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/core/include/renaissance
                  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/include/renaissance
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET renaissance_cli)
  install(TARGETS renaissance_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT RenaissanceTargets NAMESPACE Renaissance:: DESTINATION ${RN_INSTALL_CMAKEDIR})

set(RENAISSANCE_PACKAGE_WITH_CUDA ${RENAISSANCE_WITH_CUDA})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/RenaissanceConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/RenaissanceConfig.cmake
                              INSTALL_DESTINATION ${RN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/RenaissanceConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/RenaissanceConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/RenaissanceConfigVersion.cmake
        DESTINATION ${RN_INSTALL_CMAKEDIR})
