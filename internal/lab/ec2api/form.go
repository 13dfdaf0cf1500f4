package ec2api

import (
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// form is a Query API request's parameters. Lists come flattened as
// Name.1, Name.2 … and structures as Name.N.Member (the ec2 protocol).
type form url.Values

func (f form) str(k string) string { return url.Values(f).Get(k) }

func (f form) has(k string) bool { _, ok := f[k]; return ok }

func (f form) boolean(k string) (bool, *apiError) {
	if !f.has(k) {
		return false, nil
	}
	b, err := strconv.ParseBool(f.str(k))
	if err != nil {
		return false, invalidValue("Value (%s) for parameter %s is invalid.", f.str(k), k)
	}
	return b, nil
}

// integer reports whether k was given, and its value.
func (f form) integer(k string) (int, bool, *apiError) {
	if !f.has(k) {
		return 0, false, nil
	}
	n, err := strconv.Atoi(f.str(k))
	if err != nil {
		return 0, true, invalidValue("Value (%s) for parameter %s is invalid.", f.str(k), k)
	}
	return n, true, nil
}

// indexes are the N of every key prefix.N or prefix.N.…, in order.
func (f form) indexes(prefix string) []int {
	var out []int
	for k := range f {
		rest, ok := strings.CutPrefix(k, prefix+".")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ".")
		if i, err := strconv.Atoi(n); err == nil && !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// list is a flattened list of strings: prefix.1, prefix.2 ….
func (f form) list(prefix string) []string {
	var out []string
	for _, i := range f.indexes(prefix) {
		if k := prefix + "." + strconv.Itoa(i); f.has(k) {
			out = append(out, f.str(k))
		}
	}
	return out
}

// members are the keys of a flattened list of structures, prefix.N.
func (f form) members(prefix string) []string {
	var out []string
	for _, i := range f.indexes(prefix) {
		out = append(out, prefix+"."+strconv.Itoa(i))
	}
	return out
}

func (f form) addrs(prefix string) ([]netip.Addr, *apiError) {
	var out []netip.Addr
	for _, s := range f.list(prefix) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, invalidValue("Invalid IPv4 address %q", s)
		}
		out = append(out, a)
	}
	return out, nil
}

// tags reads prefix.N.Key / prefix.N.Value.
func (f form) tags(prefix string) map[string]string {
	out := map[string]string{}
	for _, m := range f.members(prefix) {
		out[f.str(m+".Key")] = f.str(m + ".Value")
	}
	return out
}

type filter struct {
	name   string
	values []string
}

func (f form) filters() []filter {
	var out []filter
	for _, m := range f.members("Filter") {
		out = append(out, filter{name: f.str(m + ".Name"), values: f.list(m + ".Value")})
	}
	return out
}

// match: one of the filter's values matches one of the resource's, with
// EC2's wildcards (* any run, ? one character).
func (fl filter) match(have ...string) bool {
	for _, v := range fl.values {
		for _, h := range have {
			if glob(v, h) {
				return true
			}
		}
	}
	return false
}

// matchTags handles tag:<key> and tag-key; ok is false for other names.
func (fl filter) matchTags(tags map[string]string) (matched, ok bool) {
	if k, isTag := strings.CutPrefix(fl.name, "tag:"); isTag {
		v, has := tags[k]
		return has && fl.match(v), true
	}
	if fl.name == "tag-key" {
		for k := range tags {
			if fl.match(k) {
				return true, true
			}
		}
		return false, true
	}
	return false, false
}

func errFilter(name string) *apiError {
	return errorf(400, "InvalidFilter", "The filter '%s' is invalid", name)
}

// glob matches s against a pattern where * is any run of characters and ?
// one character ('/' is nothing special, unlike path.Match).
func glob(pattern, s string) bool {
	p, t := []rune(pattern), []rune(s)
	star, mark := -1, 0
	i, j := 0, 0
	for j < len(t) {
		switch {
		case i < len(p) && (p[i] == '?' || p[i] == t[j]):
			i++
			j++
		case i < len(p) && p[i] == '*':
			star, mark = i, j
			i++
		case star >= 0:
			i, mark = star+1, mark+1
			j = mark
		default:
			return false
		}
	}
	for i < len(p) && p[i] == '*' {
		i++
	}
	return i == len(p)
}
