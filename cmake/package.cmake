# package.cmake - `cpack -G DEB` in a build directory makes
# forgealloc_<version>_<arch>.deb: the library, the launchers, the header and
# the Python helper under /usr, installable with `apt-get install ./forgealloc_*.deb`.
set(FA_DEB_MAINTAINER "The forgealloc authors" CACHE STRING "Maintainer field of the Debian package")

set(CPACK_PACKAGE_NAME forgealloc)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "allocator shim for PyTorch programs: tcmalloc that gives memory back, a CUDA pool, exact stats")
set(CPACK_PACKAGE_DESCRIPTION "Preloaded with LD_PRELOAD (or `forgealloc run`), it serves malloc and C++ new from gperftools TCMalloc and returns freed memory to the OS, serves cudaMalloc from a per-GPU pool, and reports exact allocation statistics at exit, on demand or periodically.")
set(CPACK_PACKAGE_CONTACT "${FA_DEB_MAINTAINER}")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # forgealloc_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
# dpkg-shlibdeps (packages dpkg-dev and file) derives the dependencies from what the
# binaries link: libtcmalloc-minimal4, libc6, libstdc++6, with versions.
# (The forgealloc command is linked statically: it adds none.)  python3 runs
# `forgealloc report`; tini is the init the Docker image runs the command under.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "tini")
include(CPack)
