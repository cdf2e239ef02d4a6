/* nofp.c built for Intel IBT (see build.rs): its PLT stubs start with endbr64 and live in
 * .plt.sec, the layout of distributions that build with -fcf-protection. */
#include "nofp.c"
