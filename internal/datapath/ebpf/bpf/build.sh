#!/bin/sh
# Builds fastpath.o from fastpath.c with Debian's clang (apt: clang llvm
# libbpf-dev), reproducibly: the source directory is mapped to "." so the
# object is the same byte for byte wherever the tree is checked out
# (make verify-generate compares it with the committed one).
set -eu
cd "$(dirname "$0")"
clang -O2 -g -Wall -Werror -target bpf -fdebug-prefix-map="$(pwd)"=. \
	-I/usr/include/"$(uname -m)"-linux-gnu -c fastpath.c -o fastpath.o
# DWARF out, BTF (which the loader needs) kept.
llvm-strip-14 -g fastpath.o 2>/dev/null || llvm-strip -g fastpath.o
