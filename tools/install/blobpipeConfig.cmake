# blobpipeConfig.cmake — find_package(blobpipe) for a tree that
# tools/install.sh (bazel/bazelw run //:install -- PREFIX) installed:
#
#   find_package(blobpipe REQUIRED)          # CMAKE_PREFIX_PATH=PREFIX
#   target_link_libraries(app PRIVATE blobpipe::blobpipe)
#
# blobpipe::blobpipe is the static library with its headers, the
# compile definitions it was built with (Asio standalone, msgpack without
# Boost; the same in every translation unit), C++20, and what it links:
# UCX (ucp, uct, ucs), OpenSSL's crypto, libsodium and threads. The
# headers need Debian's libasio-dev and libmsgpack-cxx-dev, the link
# libucx-dev, libssl-dev and libsodium-dev. Paths are relative to this file, so the tree can move.
get_filename_component(_blobpipe_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
if(NOT TARGET blobpipe::blobpipe)
  add_library(blobpipe::blobpipe STATIC IMPORTED)
  set_target_properties(blobpipe::blobpipe PROPERTIES
    IMPORTED_LOCATION "${_blobpipe_prefix}/lib/libblobpipe.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_blobpipe_prefix}/include"
    INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;ASIO_NO_DEPRECATED;ASIO_HAS_STD_ALIGNED_ALLOC=1;MSGPACK_NO_BOOST"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES "ucp;uct;ucs;crypto;sodium;Threads::Threads")
endif()
unset(_blobpipe_prefix)
