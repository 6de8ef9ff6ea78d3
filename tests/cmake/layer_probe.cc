// Compiled with one layer's include view (tests/CMakeLists.txt, Layers.*): includes
// KEEL_PROBE_HEADER, which must compile when that layer may use it and must not when it may not.
#include KEEL_PROBE_HEADER
