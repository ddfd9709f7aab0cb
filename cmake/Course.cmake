# course_lesson(NN topic [DEPENDS MM ...] [TEST_DEPENDS KK ...]) declares lesson NN_topic:
#
#   lessonNN_solution   library from solutions/NN_topic/*.cpp (+ lessons/NN_topic/given.cpp)
#   lessonNN_exercise   library from <exercises>/NN_topic/*.cpp (+ given.cpp; exercises track only)
#
# lessons/NN_topic/given.cpp, when present, is the plumbing handed to students (constructors,
# queues, validation): written once, compiled into both libraries.
#   lessonNN            what this track's tests and programs of lesson NN use
#   lessonNN_tests      tests/NN_topic/*_test.cpp, one ctest per test case,
#                       labels lessonNN and graded
#   lessonNN_cuda_tests tests/NN_topic/*_test.cu where CUDA is built, label cuda too
#   lessonNN_demo/bench lessons/NN_topic/demo.cpp and bench.cpp, when present
#
# A lesson's library links the *reference* libraries of the lessons it
# DEPENDS on, in both tracks: a student stuck on lesson 2 can still do lesson 3. TEST_DEPENDS
# names lessons only its tests use (their reference libraries, linked into the tests alone): a
# library that needs no more than it uses keeps a program that takes lesson KK from exercises/
# from linking lesson KK's reference too.
set(COURSE_TEST_TIMEOUT 120 CACHE STRING "Seconds one test case may run before it counts as failed")

function(course_lesson nn topic)
  cmake_parse_arguments(L "" "" "DEPENDS;TEST_DEPENDS" ${ARGN})
  set(dir "${nn}_${topic}")
  set_property(GLOBAL APPEND PROPERTY COURSE_LESSONS "${dir}")

  set(dep_libs "")
  foreach(dep IN LISTS L_DEPENDS)
    list(APPEND dep_libs "lesson${dep}_solution")
  endforeach()
  set(test_libs lesson${nn})
  foreach(dep IN LISTS L_TEST_DEPENDS)
    list(APPEND test_libs "lesson${dep}_solution")
  endforeach()
  set_property(GLOBAL PROPERTY COURSE_TEST_LIBS_${nn} "${test_libs}")

  # lessons/NN_topic/given*.cpp: the plumbing given to students, in both tracks. given_cuda.cpp
  # calls the CUDA runtime and is built where CUDA is (given_kernels.cu too); given_http.cpp and given_http_*.cpp serve
  # HTTP (lesson 10) and are built where Boost.Beast is (COURSE_HTTP).
  file(GLOB given CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/lessons/${dir}/given*.cpp")
  list(FILTER given EXCLUDE REGEX "/given_(cuda|http[a-z_]*)\\.cpp$")
  if(COURSE_HAVE_CUDA AND EXISTS "${CMAKE_SOURCE_DIR}/lessons/${dir}/given_cuda.cpp")
    list(APPEND given "${CMAKE_SOURCE_DIR}/lessons/${dir}/given_cuda.cpp")
  endif()
  # given_kernels.cu: kernels the given code launches besides yours (lesson 07's fused ones);
  # *_variants.cu: given second designs of your kernels, which the benches time beside yours and
  # the given code may call where asked to (lesson 08's tiled attention).
  if(COURSE_HAVE_CUDA)
    file(GLOB given_cu CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/lessons/${dir}/given_kernels.cu"
         "${CMAKE_SOURCE_DIR}/lessons/${dir}/*_variants.cu")
    foreach(cu IN LISTS given_cu)
      course_cuda_source(given_kernels "${cu}")
      list(APPEND given "${given_kernels}")
    endforeach()
  endif()
  # given_http.cpp and its rooms, given_http_*.cpp (lesson 10's server), compiled as one file: each
  # parses Boost.Beast's headers, which is most of its compile (the seven took 58 s one by one and
  # 22 s as one, on one core). So give their file-local helpers distinct names.
  set(lesson_http OFF)
  if(COURSE_HAVE_HTTP AND EXISTS "${CMAKE_SOURCE_DIR}/lessons/${dir}/given_http.cpp")
    file(GLOB http_rooms CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/lessons/${dir}/given_http*.cpp")
    course_unity_source(http_one lesson${nn}_given_http "lesson ${nn}'s given HTTP server" "${http_rooms}")
    list(APPEND given "${http_one}")
    set(lesson_http ON)
  endif()
  course_sources(sol_src "${CMAKE_SOURCE_DIR}/solutions/${dir}")
  add_library(lesson${nn}_solution STATIC ${sol_src} ${given})
  target_link_libraries(lesson${nn}_solution PUBLIC infer_common ${dep_libs} PRIVATE course_flags)
  course_link_cuda(lesson${nn}_solution "${sol_src};${given}")
  if(lesson_http)
    target_link_libraries(lesson${nn}_solution PUBLIC course_http)
  endif()

  if(COURSE_TRACK STREQUAL "exercises")
    course_sources(ex_src "${COURSE_EXERCISES_DIR}/${dir}")
    if(NOT ex_src)
      # One missing lesson must not stop the others from being built and graded: this lesson
      # gets no targets, and the grader reports it as not built.
      message(WARNING "lesson ${nn}: no sources in ${COURSE_EXERCISES_DIR}/${dir} (expected ${dir}/*.cpp): "
                      "its tests are not built")
      course_manifest_add("${dir}" "" "" "missing: no ${dir}/*.cpp in ${COURSE_EXERCISES_DIR}")
      return()
    endif()
    add_library(lesson${nn}_exercise STATIC ${ex_src} ${given})
    course_manifest_rewrites("${COURSE_EXERCISES_DIR}/${dir}")
    file(GLOB student_cpp "${COURSE_EXERCISES_DIR}/${dir}/*.cpp")
    if(COURSE_STUDENT_FLAGS)
      # The student's .cpp files, and the host rewrites of their .cu files where the kernels are
      # emulated, but in the lessons COURSE_STUDENT_FLAGS_SKIP_KERNELS names (nvcc's flags stay as
      # they are).
      set(own ${student_cpp})
      if(COURSE_CUDA_EMULATED AND NOT nn IN_LIST COURSE_STUDENT_FLAGS_SKIP_KERNELS)
        set(rewrites ${ex_src})
        list(FILTER rewrites INCLUDE REGEX "\\.cu\\.cpp$")
        list(APPEND own ${rewrites})
      endif()
      set_property(SOURCE ${own} APPEND PROPERTY COMPILE_OPTIONS ${COURSE_STUDENT_FLAGS})
    endif()
    if(COURSE_STUDENT_PCH)
      course_student_pch(lesson${nn}_exercise "${student_cpp}")
    endif()
    target_link_libraries(lesson${nn}_exercise PUBLIC infer_common ${dep_libs} PRIVATE course_flags)
    course_link_cuda(lesson${nn}_exercise "${ex_src};${given}")
    if(lesson_http)
      target_link_libraries(lesson${nn}_exercise PUBLIC course_http)
    endif()
    set(track_lib lesson${nn}_exercise)
  else()
    set(track_lib lesson${nn}_solution)
  endif()
  add_library(lesson${nn} INTERFACE)
  target_link_libraries(lesson${nn} INTERFACE ${track_lib})

  # *_test.cpp: graded everywhere. *_cuda_test.cpp (plain C++ calling the kernels' host
  # functions) and *_test.cu: built where CUDA is, labelled cuda, skipped without a device.
  file(GLOB test_src CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/${dir}/*_test.cpp")
  list(FILTER test_src EXCLUDE REGEX "_cuda_test\\.cpp$")
  if(NOT COURSE_HAVE_HTTP)  # *_http_test.cpp: the HTTP server's tests, where it is built
    list(FILTER test_src EXCLUDE REGEX "_http_test\\.cpp$")
  endif()
  if(test_src)
    course_add_tests(lesson${nn}_tests "lesson${nn};graded" "${test_libs}" ${test_src})
    course_manifest_add("${dir}" lesson${nn}_tests "${test_src}" "")
  endif()
  file(GLOB cuda_test_src CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/${dir}/*_test.cu"
                                            "${CMAKE_SOURCE_DIR}/tests/${dir}/*_cuda_test.cpp")
  if(cuda_test_src AND COURSE_HAVE_CUDA)
    # File by file: the emulated kernels' and the host-side engine's test programs (tests/common)
    # compile the same files with the same flags, so ccache gives each object to both. As one
    # file, lessons 07 and 08's took 20 and 17 s more in a clean build (their files alone: 14 and
    # 10 s, 14 and 12 s, compiled for those programs anyway).
    course_add_tests(lesson${nn}_cuda_tests "lesson${nn};graded;cuda" "${test_libs}" ONE_BY_ONE ${cuda_test_src})
    target_link_libraries(lesson${nn}_cuda_tests PRIVATE course_cudart)
    course_manifest_add("${dir}" lesson${nn}_cuda_tests "${cuda_test_src}" "")
  endif()

  # COURSE_PROGRAMS=OFF (the sanitizer build): no test runs these programs, so they are left out.
  set(progs "")
  if(NOT DEFINED COURSE_PROGRAMS OR COURSE_PROGRAMS)
    set(progs demo bench)
    if(lesson_http)  # lessons/NN_topic/serve.cpp, load.cpp: HTTP programs
      list(APPEND progs serve load)
    endif()
  endif()
  foreach(prog IN LISTS progs)
    if(EXISTS "${CMAKE_SOURCE_DIR}/lessons/${dir}/${prog}.cpp")
      add_executable(lesson${nn}_${prog} "${CMAKE_SOURCE_DIR}/lessons/${dir}/${prog}.cpp")
      target_link_libraries(lesson${nn}_${prog} PRIVATE lesson${nn} course_flags)
    endif()
  endforeach()
  # lessons/NN_topic/cuda_bench.cpp: the lesson's GPU measurements (./course gpu-check runs them).
  # (Not emulated: their figures would be the host's, and lesson 07's compares with cuBLAS.)
  if(COURSE_HAVE_CUDA AND NOT COURSE_CUDA_EMULATED AND progs AND EXISTS "${CMAKE_SOURCE_DIR}/lessons/${dir}/cuda_bench.cpp")
    add_executable(lesson${nn}_cuda_bench "${CMAKE_SOURCE_DIR}/lessons/${dir}/cuda_bench.cpp")
    target_link_libraries(lesson${nn}_cuda_bench PRIVATE lesson${nn} course_flags CUDA::cudart CUDA::cublas)
  endif()
endfunction()

# course_cuda_source(out file.cu): the source to compile for a .cu file: itself, or with
# COURSE_CUDA=EMULATE its rewrite as host C++ (course_emulated_source).
function(course_cuda_source out cu)
  if(COURSE_CUDA_EMULATED)
    course_emulated_source(cpp "${cu}")
  else()
    set(cpp "${cu}")
  endif()
  set(${out} "${cpp}" PARENT_SCOPE)
endfunction()

# course_emulated_source(out file.cu): the .cu file rewritten as host C++ whose kernels run thread
# by thread (tests/common/host_device/emulate_cu.py, emulated_cuda.hpp), in emulated/<path>.cpp of
# COURSE_SHARED_DIR (or of the build tree, below), redone when the .cu file changes. Link
# course_cudart's stand-in.
function(course_emulated_source out cu)
  file(RELATIVE_PATH rel "${CMAKE_SOURCE_DIR}" "${cu}")
  if(rel MATCHES "^(\\.\\./|build/)")
    # A student's copy outside the checkout or in its build folder (the catalogue's): this tree's.
    string(REPLACE "../" "" rel "${rel}")
    set(cpp "${CMAKE_BINARY_DIR}/emulated/${rel}.cpp")
  else()
    # A file of the checkout (given kernels, the solutions', the exercises'): every tree compiles
    # the same rewrite from one path, so ccache gives each tree the first one's object (the given
    # kernels' rewrites took 14 s to compile in each catalogue tree). emulate_cu.py writes it whole
    # and renames it into place: trees build at once.
    set(cpp "${COURSE_SHARED_DIR}/emulated/${rel}.cpp")
  endif()
  add_custom_command(OUTPUT "${cpp}"
    COMMAND "${COURSE_PYTHON}" "${CMAKE_SOURCE_DIR}/tests/common/host_device/emulate_cu.py" "${cu}" "${cpp}"
    DEPENDS "${cu}" "${CMAKE_SOURCE_DIR}/tests/common/host_device/emulate_cu.py"
    COMMENT "Rewriting ${rel} to run on the host")
  # The rewrite is the kernels' source as it is: nvcc does not warn of what these would. Its own
  # #include "..." lines still find the files beside the .cu file (-iquote).
  get_filename_component(cu_dir "${cu}" DIRECTORY)
  set_source_files_properties("${cpp}" PROPERTIES COMPILE_OPTIONS
    "-iquote;${cu_dir};-Wno-unknown-pragmas;-Wno-sign-compare;-Wno-unused-parameter;-Wno-error")
  set(${out} "${cpp}" PARENT_SCOPE)
endfunction()

# course_student_pch(target student_cpp): COURSE_STUDENT_PCH. The course's own headers that the
# student's .cpp files include ("common/..." and "lessons/..."), precompiled for those files alone
# and with their COURSE_STUDENT_FLAGS (GCC passes over a header precompiled with optimization when
# it compiles a file without, "__OPTIMIZE__ not defined", and parses the headers again): every
# other file of the target (the given code, the rewrites of the student's .cu files) compiles
# as in any other tree, so ccache still gives its object. An object compiled with a precompiled
# header does not come back from ccache: where a lesson has two student files, the file an entry
# leaves alone keeps its object because the grader deletes only the objects of the files whose text
# changed (tools/grader.py, remove_outputs).
function(course_student_pch target student_cpp)
  set(headers "")
  foreach(cpp IN LISTS student_cpp)
    file(STRINGS "${cpp}" lines REGEX "^#include \"(common|lessons)/[^\"]+\\.hpp\"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "${CMAKE_SOURCE_DIR}/\\1" header "${line}")
      list(APPEND headers "${header}")
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES headers)
  if(headers)
    target_precompile_headers(${target} PRIVATE ${headers})
    if(COURSE_STUDENT_FLAGS)  # compiled as the files that include it: GCC uses it only then
      set_source_files_properties("${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/${target}.dir/cmake_pch.hxx.cxx"
        PROPERTIES COMPILE_OPTIONS "${COURSE_STUDENT_FLAGS}")
    endif()
    get_target_property(all ${target} SOURCES)
    list(REMOVE_ITEM all ${student_cpp})
    set_source_files_properties(${all} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

# course_sources(out dir): a lesson's sources in dir, its .cu files too where CUDA is built.
function(course_sources out dir)
  file(GLOB found CONFIGURE_DEPENDS "${dir}/*.cpp")
  if(COURSE_HAVE_CUDA)
    file(GLOB cu_files CONFIGURE_DEPENDS "${dir}/*.cu")
    foreach(cu IN LISTS cu_files)
      course_cuda_source(src "${cu}")
      list(APPEND found "${src}")
    endforeach()
  endif()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# course_link_cuda(target sources): a library with .cu sources (or given_cuda.cpp, or their
# emulated rewrites) needs the CUDA runtime.
function(course_link_cuda target sources)
  list(FILTER sources INCLUDE REGEX "(\\.cu|\\.cu\\.cpp|given_cuda\\.cpp)$")
  if(sources)
    target_link_libraries(${target} PUBLIC course_cudart)
  endif()
endfunction()

# course_test_harness(target [ONE_BY_ONE]): marks a test program (its own files are the GoogleTest
# cases, which the sanitizer build compiles under AddressSanitizer alone) and compiles its test
# files as one: each parses GoogleTest's, Eigen's and the course's headers, which is most of its
# compile (lesson 04's four test files took 24.8 s one by one and 13.9 s as one; under ASan, 36.5 s
# and 16.0 s). The one file, NAME-<digest of its text>.cpp, #includes them in COURSE_SHARED_DIR,
# which every build tree of the checkout shares: ccache keys an object on its source file's path,
# and the solutions, exercises, grading and catalogue trees take one another's test objects from
# it. The test files of one program therefore compile as one: give file-local helpers distinct
# names (ONE_BY_ONE: a program whose files come from several lessons, with like-named helpers).
function(course_test_harness target)
  cmake_parse_arguments(H "ONE_BY_ONE" "" "" ${ARGN})
  set_target_properties(${target} PROPERTIES COURSE_TEST_HARNESS ON)
  get_target_property(sources ${target} SOURCES)
  set(cpp "")
  set(others "")
  foreach(src IN LISTS sources)
    get_filename_component(src "${src}" ABSOLUTE)
    if(src MATCHES "\\.cpp$")
      list(APPEND cpp "${src}")
    else()
      list(APPEND others "${src}")
    endif()
  endforeach()
  list(LENGTH cpp files)
  if(H_ONE_BY_ONE OR files LESS 2)
    return()
  endif()
  course_unity_source(one ${target} "${target}'s test files" "${cpp}")
  set_property(TARGET ${target} PROPERTY SOURCES "${one}" ${others})
endfunction()

# course_unity_source(out name what files): one C++ file that #includes `files` (absolute paths),
# COURSE_SHARED_DIR/unity/NAME-<digest of its text>.cpp: in the folder every build tree of the
# checkout shares, so that ccache, which keys an object on its source file's path, gives each tree
# the first one's object.
function(course_unity_source out name what files)
  set(text "// ${what}, compiled as one (cmake/Course.cmake).\n")
  foreach(src IN LISTS files)
    string(APPEND text "#include \"${src}\"\n")
  endforeach()
  string(SHA1 digest "${text}")
  string(SUBSTRING "${digest}" 0 12 digest)
  set(one "${COURSE_SHARED_DIR}/unity/${name}-${digest}.cpp")
  if(NOT EXISTS "${one}")  # (build trees configured at once: each writes whole files, renamed into place)
    string(RANDOM LENGTH 12 part)
    file(WRITE "${one}.${part}" "${text}")
    file(RENAME "${one}.${part}" "${one}")
  endif()
  set(${out} "${one}" PARENT_SCOPE)
endfunction()

# course_add_tests(target labels libs [ONE_BY_ONE] sources...): one test binary, each GoogleTest
# case its own ctest (so a crash or a hang costs that case only); ONE_BY_ONE as in
# course_test_harness.
function(course_add_tests target labels libs)
  cmake_parse_arguments(T "ONE_BY_ONE" "" "" ${ARGN})
  add_executable(${target} ${T_UNPARSED_ARGUMENTS})
  if(T_ONE_BY_ONE)
    course_test_harness(${target} ONE_BY_ONE)
  else()
    course_test_harness(${target})
  endif()
  target_link_libraries(${target} PRIVATE ${libs} course_testing course_test_main course_flags)
  course_discover_tests(${target} "${labels}")
endfunction()

# course_discover_tests(target labels): one ctest per GoogleTest case, with a timeout and labels.
function(course_discover_tests target labels)
  gtest_discover_tests(${target}
    DISCOVERY_MODE PRE_TEST
    TEST_LIST ${target}_TESTS
    # ctest runs cases side by side: one OpenMP thread each keeps them from fighting over cores.
    PROPERTIES TIMEOUT ${COURSE_TEST_TIMEOUT} ENVIRONMENT OMP_NUM_THREADS=1)
  # gtest_discover_tests flattens a list-valued property ("lesson00;graded" would become two
  # words), so the labels are set by a file ctest reads after the discovered tests.
  set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake")
  file(WRITE "${labels_file}"
    "if(${target}_TESTS)\n  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${labels}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
endfunction()

# course_extra_tests(DIR): an instructor's hidden tests, DIR/NN_topic/*_test.cpp,
# graded against this track's lesson NN exactly like the course's own tests.
function(course_extra_tests root)
  get_property(lessons GLOBAL PROPERTY COURSE_LESSONS)
  set(found FALSE)
  foreach(dir IN LISTS lessons)
    file(GLOB extra CONFIGURE_DEPENDS "${root}/${dir}/*_test.cpp")
    if(extra)
      string(SUBSTRING "${dir}" 0 2 nn)
      if(TARGET lesson${nn})
        get_property(test_libs GLOBAL PROPERTY COURSE_TEST_LIBS_${nn})
        # One by one: an instructor's files were not written to share a namespace.
        course_add_tests(lesson${nn}_extra_tests "lesson${nn};graded;extra" "${test_libs}" ONE_BY_ONE ${extra})
        course_manifest_add("${dir}" lesson${nn}_extra_tests "${extra}" "")
      endif()
      set(found TRUE)
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "COURSE_EXTRA_TESTS=${root}: no NN_topic/*_test.cpp files for any lesson")
  endif()
endfunction()

# course_tool(name source LESSONS NN ...): a program built on several lessons, such as
# `generate`. The solutions track builds `name` from the reference libraries. The exercises
# track builds name_lessonNN for each NN instead: lesson NN from exercises/, every other
# lesson from solutions/, so `./course generate --mine NN` runs your lesson NN alone.
function(course_tool name source)
  cmake_parse_arguments(T "" "" "LESSONS" ${ARGN})
  set(track_libs "")
  foreach(nn IN LISTS T_LESSONS)
    list(APPEND track_libs lesson${nn}_solution)
  endforeach()
  if(COURSE_TRACK STREQUAL "solutions")
    add_executable(${name} "${source}")
    target_link_libraries(${name} PRIVATE ${track_libs} course_flags)
    target_compile_definitions(${name} PRIVATE COURSE_HAVE_CUDA=$<BOOL:${COURSE_HAVE_CUDA}>)
  else()
    foreach(mine IN LISTS T_LESSONS)
      set(libs lesson${mine}_exercise)
      foreach(nn IN LISTS T_LESSONS)
        if(NOT nn STREQUAL mine)
          list(APPEND libs lesson${nn}_solution)
        endif()
      endforeach()
      add_executable(${name}_lesson${mine} "${source}")
      target_link_libraries(${name}_lesson${mine} PRIVATE ${libs} course_flags)
      target_compile_definitions(${name}_lesson${mine} PRIVATE COURSE_HAVE_CUDA=$<BOOL:${COURSE_HAVE_CUDA}>)
    endforeach()
  endif()
endfunction()

# The grader's map of the build (tools/grader.py reads build/<preset>/course_tests.json): for
# each lesson, its test programs, the sources each was built from and where the program lands,
# or why the lesson has none.
function(course_manifest_add lesson target sources problem)
  if(target)
    set(binary "$<TARGET_FILE:${target}>")
  else()
    set(binary "")
  endif()
  set(quoted "")
  foreach(src IN LISTS sources)
    list(APPEND quoted "\"${src}\"")
  endforeach()
  list(JOIN quoted ", " quoted)
  set_property(GLOBAL APPEND_STRING PROPERTY COURSE_MANIFEST
    "  {\"lesson\": \"${lesson}\", \"target\": \"${target}\", \"binary\": \"${binary}\", \"sources\": [${quoted}], \"problem\": \"${problem}\"},\n")
endfunction()

# course_manifest_rewrites(dir): where COURSE_CUDA=EMULATE rewrites the student's .cu files of dir as
# host C++. The grader deletes the rewrite of a .cu file whose text changed: ninja redoes a rewrite
# only when the .cu file is newer than it, and a file put back as it was (a copy that keeps its
# time, as the catalogue makes) is older.
function(course_manifest_rewrites dir)
  if(NOT COURSE_HAVE_CUDA)
    return()
  endif()
  file(GLOB cu_files "${dir}/*.cu")
  foreach(cu IN LISTS cu_files)
    course_cuda_source(rewrite "${cu}")
    if(NOT rewrite STREQUAL cu)
      set_property(GLOBAL APPEND_STRING PROPERTY COURSE_MANIFEST_REWRITES "\"${cu}\": \"${rewrite}\", ")
    endif()
  endforeach()
endfunction()

# course_write_manifest(): call once, after every lesson and the extra tests are declared.
function(course_write_manifest)
  get_property(entries GLOBAL PROPERTY COURSE_MANIFEST)
  string(REGEX REPLACE ",\n$" "\n" entries "${entries}")
  get_property(rewrites GLOBAL PROPERTY COURSE_MANIFEST_REWRITES)
  string(REGEX REPLACE ", $" "" rewrites "${rewrites}")
  file(GENERATE OUTPUT "${CMAKE_BINARY_DIR}/course_tests.json" CONTENT
    "{\"track\": \"${COURSE_TRACK}\", \"exercises\": \"${COURSE_EXERCISES_DIR}\", \"source\": \"${CMAKE_SOURCE_DIR}\", \"cuda_emulated\": $<IF:$<BOOL:${COURSE_CUDA_EMULATED}>,true,false>, \"rewrites\": {${rewrites}}, \"tests\": [\n${entries}]}\n")
endfunction()
