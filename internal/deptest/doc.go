// Package deptest holds tests of what vpcni's shipped binaries link; it
// has no code of its own.
package deptest
