#pragma once

#include <string>

namespace tandem {

// The checkout and the build directory of the running test or tool, found at run time rather
// than compiled in: an object compiled from a test does not depend on where the checkout lives,
// so clones in other directories (CI's) share the compiler cache (scripts/ccache_args.sh).
//
// TestBinaryDir(): $TANDEM_BINARY_DIR, else the parent of the executable's folder (every
// executable is built into <build>/bin). TestSourceDir(): $TANDEM_SOURCE_DIR, else the source
// directory recorded in <build>/CMakeCache.txt when it still exists, else <build>/.. (a build
// folder inside the checkout, as a copied or unpacked build is). Both abort with a message when
// nothing is found: a test cannot run without its data.
std::string TestSourceDir();
std::string TestBinaryDir();

}  // namespace tandem
