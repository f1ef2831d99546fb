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
  # Test sources at -O1 where the build type optimizes more: the code under test is the
  # libraries', built at the build type's level, and GCC at -O3 spent a third more on the tests'
  # gtest-heavy bodies (the sanitizer builds are -O1 already and are left as they are).
  string(TOUPPER "${CMAKE_BUILD_TYPE}" type)
  if(type AND CMAKE_CXX_FLAGS_${type} MATCHES "-O[23s]")
    target_compile_options(${name} PRIVATE -O1)
  endif()
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

# TANDEM_UNITY: every target's own C++ sources compiled in bundles of TANDEM_UNITY_BATCH files
# (one translation unit includes them), so the system headers they share (the C++ library, abseil,
# protobuf, gRPC) are parsed once per bundle instead of once per file: a cold build of a library
# takes about a third of the CPU time. The bundles include their files by paths relative to the
# checkout (CMake's own UNITY_BUILD writes absolute paths, which would make every bundle miss the
# shared compiler cache from another clone). Left out: generated sources, sources with their own
# compile flags (the CPU kernel tiers), CUDA, and targets marked TANDEM_NO_UNITY. scripts/build.sh,
# build_emulated.sh, sanitize.sh and cross_aarch64.sh turn it on; a plain configure leaves it off
# (an edit recompiles one file, not its bundle).
option(TANDEM_UNITY "Compile each target's sources in bundles (faster cold builds)" OFF)
set(TANDEM_UNITY_BATCH 8 CACHE STRING "Source files per TANDEM_UNITY bundle")

function(tandem_unity_target target)
  get_target_property(type ${target} TYPE)
  if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
    return()
  endif()
  get_target_property(skip ${target} TANDEM_NO_UNITY)
  if(skip)
    return()
  endif()
  get_target_property(dir ${target} SOURCE_DIR)
  get_target_property(sources ${target} SOURCES)
  set(kept)
  set(bundled)
  foreach(source IN LISTS sources)
    set(eligible OFF)
    if(source MATCHES "\\.cc$" AND NOT source MATCHES "\\$<")
      get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${dir}")
      file(RELATIVE_PATH relative "${PROJECT_SOURCE_DIR}" "${path}")
      string(FIND "${path}" "${PROJECT_BINARY_DIR}/" in_build)
      if(NOT relative MATCHES "^\\.\\./" AND NOT in_build EQUAL 0)
        set(eligible ON)
        foreach(property COMPILE_OPTIONS COMPILE_DEFINITIONS COMPILE_FLAGS INCLUDE_DIRECTORIES
                         SKIP_UNITY_BUILD_INCLUSION GENERATED)
          get_source_file_property(value "${path}" DIRECTORY "${dir}" ${property})
          if(value)
            set(eligible OFF)
          endif()
        endforeach()
      endif()
    endif()
    if(eligible)
      list(APPEND bundled "${relative}")
    else()
      list(APPEND kept "${source}")
    endif()
  endforeach()
  list(LENGTH bundled count)
  if(count LESS 2)
    return()
  endif()
  # Bundles of TANDEM_UNITY_BATCH files in source order, rewritten only when their list changes.
  set(bundles)
  set(index 0)
  set(content "")
  set(in_bundle 0)
  set(done 0)
  foreach(relative IN LISTS bundled)
    string(APPEND content "#include \"${relative}\"\n")
    math(EXPR in_bundle "${in_bundle} + 1")
    math(EXPR done "${done} + 1")
    if(in_bundle EQUAL TANDEM_UNITY_BATCH OR done EQUAL count)
      set(file "${PROJECT_BINARY_DIR}/unity/${target}_${index}.cc")
      set(text "// Generated (TANDEM_UNITY, cmake/tandem.cmake).\n${content}")
      set(old "")
      if(EXISTS "${file}")
        file(READ "${file}" old)
      endif()
      if(NOT old STREQUAL text)
        file(WRITE "${file}" "${text}")
      endif()
      list(APPEND bundles "${file}")
      math(EXPR index "${index} + 1")
      set(content "")
      set(in_bundle 0)
    endif()
  endforeach()
  set_property(TARGET ${target} PROPERTY SOURCES ${kept} ${bundles})
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}")
endfunction()

# Applies tandem_unity_target to every target defined under `dir` (call once, at the end of the
# top-level CMakeLists.txt, after every target has its sources).
function(tandem_unity_all dir)
  if(NOT TANDEM_UNITY)
    return()
  endif()
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    tandem_unity_target(${target})
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    tandem_unity_all("${subdir}")
  endforeach()
endfunction()
