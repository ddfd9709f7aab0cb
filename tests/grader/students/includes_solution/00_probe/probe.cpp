// A student who hands in the reference solution: full marks, and a line the roster's note puts first.
#include "solutions/00_probe/probe.cpp"
