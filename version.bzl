# blobpipe's version, MAJOR.MINOR.PATCH: the one place it is written.
# The library (blobpipe::version(), blobpipe/version.hpp), the CLI's
# --version, the Python package's __version__ and its wheel, blobpipe.pc
# and the CMake package config are made from it; //test:version_test
# checks that they agree.
BLOBPIPE_VERSION = "0.1.0"
