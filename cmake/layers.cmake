# The library is built as one static target per layer, lowest first, each
# linking only the layers it names (docs/architecture.md draws the graph).
# An #include of a layer that is not below, directly or through its DEPS,
# fails the build: cmake/check_layers.cmake runs before any layer compiles
# (the same contract as GN's `gn check` or Bazel's layering_check).
#
#   meshflow_layer(ops DEPS ir)          # src/meshflow/ops/**/*.cc -> meshflow_ops
#   meshflow_layer(cli DEPS engine TARGET meshflow_commands)  # another target name
#   meshflow_check_layers()              # after the last layer

function(meshflow_layer name)
  cmake_parse_arguments(L "" "TARGET" "DEPS;PUBLIC_LIBS;PRIVATE_LIBS;PRIVATE_INCLUDES" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/meshflow/${name}/*.cc)
  list(FILTER srcs EXCLUDE REGEX ".*/cli/main\\.cc$")
  set(t meshflow_${name})
  if(L_TARGET)
    set(t ${L_TARGET})
  endif()
  add_library(${t} STATIC ${srcs})
  target_include_directories(${t} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set(deps "")
  foreach(d IN LISTS L_DEPS)
    get_property(known GLOBAL PROPERTY MESHFLOW_LAYERS)
    if(NOT d IN_LIST known)
      message(FATAL_ERROR "meshflow_layer(${name}): DEPS names '${d}', which is not a layer "
                          "defined before it (defined: ${known})")
    endif()
    get_property(dt GLOBAL PROPERTY MESHFLOW_LAYER_TARGET_${d})
    list(APPEND deps ${dt})
  endforeach()
  target_link_libraries(${t} PUBLIC ${deps} ${L_PUBLIC_LIBS} PRIVATE ${L_PRIVATE_LIBS})
  if(L_PRIVATE_INCLUDES)
    target_include_directories(${t} PRIVATE ${L_PRIVATE_INCLUDES})
  endif()
  # Every layer may include itself and, transitively, what its DEPS may.
  set(allowed ${name})
  foreach(d IN LISTS L_DEPS)
    get_property(below GLOBAL PROPERTY MESHFLOW_LAYER_ALLOWED_${d})
    list(APPEND allowed ${below})
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set_property(GLOBAL PROPERTY MESHFLOW_LAYER_ALLOWED_${name} ${allowed})
  set_property(GLOBAL PROPERTY MESHFLOW_LAYER_TARGET_${name} ${t})
  set_property(GLOBAL APPEND PROPERTY MESHFLOW_LAYERS ${name})
  set_property(GLOBAL APPEND PROPERTY MESHFLOW_LAYER_TARGETS ${t})
endfunction()

# Writes the allowed-include table and a build step that checks every file of
# src/meshflow against it; every layer target depends on the step.
function(meshflow_check_layers)
  get_property(layers GLOBAL PROPERTY MESHFLOW_LAYERS)
  set(table "")
  foreach(l IN LISTS layers)
    get_property(allowed GLOBAL PROPERTY MESHFLOW_LAYER_ALLOWED_${l})
    list(JOIN allowed " " a)
    string(APPEND table "${l}: ${a}\n")
  endforeach()
  set(table_file ${PROJECT_BINARY_DIR}/meshflow_layers.txt)
  file(WRITE ${table_file} "${table}")
  file(GLOB_RECURSE files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/meshflow/*.h
       ${PROJECT_SOURCE_DIR}/src/meshflow/*.cc)
  set(stamp ${PROJECT_BINARY_DIR}/meshflow_layers.stamp)
  add_custom_command(OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR}/src -DTABLE=${table_file}
            -DSTAMP=${stamp} -P ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
    DEPENDS ${files} ${table_file} ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
    COMMENT "Checking that includes follow the layers (cmake/layers.cmake)"
    VERBATIM)
  add_custom_target(meshflow_layering DEPENDS ${stamp})
  get_property(targets GLOBAL PROPERTY MESHFLOW_LAYER_TARGETS)
  foreach(t IN LISTS targets)
    add_dependencies(${t} meshflow_layering)
  endforeach()
endfunction()
