package ipam

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
)

// num is an address, or a count of addresses, as a 128-bit unsigned
// number: an IPv6 range (a /64 holds 2^64 addresses) is measured and
// stepped through by arithmetic, never address by address. An IPv4
// address is its 32-bit value in lo.
type num struct{ hi, lo uint64 }

// maxNum stands for "2^128 or more": the count of a /0 of IPv6, which 128
// bits cannot hold, saturates to it.
var maxNum = num{math.MaxUint64, math.MaxUint64}

func numOf(a netip.Addr) num {
	if a.Is4() {
		b := a.As4()
		return num{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return num{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// addr is v as an address of the family of like (v must fit it).
func (v num) addr(like netip.Addr) netip.Addr {
	if like.Is4() {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(v.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], v.hi)
	binary.BigEndian.PutUint64(b[8:], v.lo)
	return netip.AddrFrom16(b)
}

// pow2 is 2^n, saturated to maxNum for n >= 128.
func pow2(n int) num {
	switch {
	case n >= 128:
		return maxNum
	case n >= 64:
		return num{hi: 1 << (n - 64)}
	case n < 0:
		return num{}
	}
	return num{lo: 1 << n}
}

// ones is 2^n - 1: the host part of a prefix with n host bits.
func ones(n int) num {
	if n >= 128 {
		return maxNum
	}
	return pow2(n).sub(num{lo: 1})
}

// add saturates at maxNum.
func (v num) add(w num) num {
	lo, c := bits.Add64(v.lo, w.lo, 0)
	hi, c := bits.Add64(v.hi, w.hi, c)
	if c != 0 {
		return maxNum
	}
	return num{hi, lo}
}

// sub stops at 0.
func (v num) sub(w num) num {
	if v.cmp(w) <= 0 {
		return num{}
	}
	lo, b := bits.Sub64(v.lo, w.lo, 0)
	hi, _ := bits.Sub64(v.hi, w.hi, b)
	return num{hi, lo}
}

func (v num) or(w num) num { return num{v.hi | w.hi, v.lo | w.lo} }

func (v num) cmp(w num) int {
	switch {
	case v.hi != w.hi:
		if v.hi < w.hi {
			return -1
		}
		return 1
	case v.lo < w.lo:
		return -1
	case v.lo > w.lo:
		return 1
	}
	return 0
}

// int is v as an int, saturated to math.MaxInt.
func (v num) int() int {
	if v.hi != 0 || v.lo > math.MaxInt {
		return math.MaxInt
	}
	return int(v.lo)
}

// span is how many addresses p holds (saturated for an IPv6 /0).
func span(p netip.Prefix) num { return pow2(p.Addr().BitLen() - p.Bits()) }

// lastAddr is p's highest address.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	return numOf(a).or(ones(a.BitLen() - p.Bits())).addr(a)
}
