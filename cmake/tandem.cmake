# Helpers shared by every module folder.

# tandem_add_test(<source> LABEL <unit|integration|e2e|gpu> LIBS <targets...> [TIMEOUT s])
# Registers one test executable built from one source file; the test name is the file's stem.
function(tandem_add_test source)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "LIBS" ${ARGN})
  get_filename_component(name "${source}" NAME_WE)
  add_executable(${name} "${source}")
  # No compile-time paths: tests find the checkout at run time (tests/util/test_paths.h), so
  # their objects hit the shared compiler cache from any clone.
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} tandem_test_util GTest::gtest GTest::gtest_main
                                        GTest::gmock)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_LABEL)
    set(ARG_LABEL unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# tandem_add_script_test(<name> <script> LABEL <...> [TIMEOUT s]): a test run by a shell or
# Python script, given the build directory as its first argument.
function(tandem_add_script_test name script)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "" ${ARGN})
  add_test(NAME ${name} COMMAND "${script}" "${PROJECT_BINARY_DIR}"
           WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}")
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# tandem_embed_text(<target> <file> <symbol>): compiles the text file <file> (relative to the
# current source folder) into <target> as `extern const char tandem::<symbol>[]`, its bytes
# NUL-terminated; editing the file rebuilds only the generated source (cmake/embed_text.cmake).
function(tandem_embed_text target file symbol)
  set(in "${CMAKE_CURRENT_SOURCE_DIR}/${file}")
  get_filename_component(name "${file}" NAME)
  set(out "${CMAKE_CURRENT_BINARY_DIR}/embedded/${name}.cc")
  add_custom_command(
    OUTPUT "${out}"
    COMMAND "${CMAKE_COMMAND}" "-DIN=${in}" "-DOUT=${out}" "-DSYMBOL=${symbol}"
            -P "${PROJECT_SOURCE_DIR}/cmake/embed_text.cmake"
    DEPENDS "${in}" "${PROJECT_SOURCE_DIR}/cmake/embed_text.cmake"
    COMMENT "Embedding ${file}"
    VERBATIM)
  target_sources(${target} PRIVATE "${out}")
endfunction()
