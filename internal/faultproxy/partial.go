package faultproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// The lists of a port a PartialPut cuts short, in the order their changes
// are applied: every list's removals first, then every list's additions.
// An entry is known by its ip_address (an allowed address pair by its
// address alone: Neutron fills in a pair's missing MAC with the port's).
// A fixed_ips entry without an address asks Neutron to pick one: always
// an addition.
var partialLists = [...]string{"fixed_ips", "allowed_address_pairs"}

// servePartial carries out a PartialPut: it reads the port, writes part of
// the client's change to it under If-Match of the revision just read, and
// answers the client 500 or drops the connection. When no partial write
// can be made — the body changes fewer than two entries, its If-Match is
// stale (Neutron would refuse all of it), Neutron refuses the partial
// write, or the port cannot be read — the client's request goes through
// untouched and counts as passed.
func (p *Proxy) servePartial(w http.ResponseWriter, r *http.Request, frac float64) {
	orig := r.Body
	body, err := io.ReadAll(io.LimitReader(orig, maxInspectBody+1))
	whole := err == nil && len(body) <= maxInspectBody
	// What is forwarded, if anything: the body as the client sent it.
	restore := func() {
		if whole {
			r.Body = io.NopCloser(bytes.NewReader(body))
		} else {
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(body), orig), orig}
		}
	}
	restore()
	drop, landed := false, false
	if whole {
		drop, landed = p.writePart(r, body, frac)
	}
	id, _ := portID(r.URL.Path)
	p.mu.Lock()
	if landed {
		p.counts[partialPut]++
		p.landed[id] = true
	} else {
		p.counts[passed]++
	}
	p.mu.Unlock()
	if !landed {
		restore()
		sw := &statusWriter{ResponseWriter: w}
		p.rp.ServeHTTP(sw, r)
		p.wrote(r, sw.code, false)
		return
	}
	if drop && dropConnection(w) {
		return
	}
	writeStatus(w, r, http.StatusInternalServerError)
}

// writePart reads the port r updates and writes part of r's change to it;
// landed says Neutron took the partial write, drop that the client's
// connection is to be dropped rather than answered.
func (p *Proxy) writePart(r *http.Request, body []byte, frac float64) (drop, landed bool) {
	var req struct {
		Port map[string]json.RawMessage `json:"port"`
	}
	if json.Unmarshal(body, &req) != nil || req.Port == nil {
		return false, false
	}
	cur, rev, err := p.readPort(r)
	if err != nil {
		return false, false
	}
	if want, ok := ifMatchRevision(r); ok && want != rev {
		return false, false
	}
	part, drop, ok := partialPort(cur, req.Port, frac)
	if !ok {
		return false, false
	}
	out, err := json.Marshal(map[string]any{"port": part})
	if err != nil {
		return false, false
	}
	put, err := http.NewRequestWithContext(r.Context(), http.MethodPut, p.backendURL(r), bytes.NewReader(out))
	if err != nil {
		return false, false
	}
	copyHeaders(put.Header, r.Header)
	put.Header.Set("Content-Type", "application/json")
	put.Header.Set("If-Match", "revision_number="+strconv.FormatInt(rev, 10))
	resp, err := p.transport.RoundTrip(put)
	if err != nil {
		return false, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return drop, resp.StatusCode >= 200 && resp.StatusCode < 300
}

// readPort GETs the port r names from Neutron, with r's credentials.
func (p *Proxy) readPort(r *http.Request) (port map[string]json.RawMessage, rev int64, err error) {
	get, err := http.NewRequestWithContext(r.Context(), http.MethodGet, p.backendURL(r), nil)
	if err != nil {
		return nil, 0, err
	}
	copyHeaders(get.Header, r.Header)
	resp, err := p.transport.RoundTrip(get)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxInspectBody))
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("read port: %s", resp.Status)
	}
	var got struct {
		Port map[string]json.RawMessage `json:"port"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		return nil, 0, err
	}
	if err := json.Unmarshal(got.Port["revision_number"], &rev); err != nil {
		return nil, 0, fmt.Errorf("port without revision_number: %w", err)
	}
	return got.Port, rev, nil
}

// backendURL is r's URL on Neutron, as the reverse proxy rewrites it.
func (p *Proxy) backendURL(r *http.Request) string {
	u := *p.target
	u.Path = strings.TrimSuffix(p.target.Path, "/") + r.URL.Path
	u.RawPath, u.RawQuery = "", ""
	return u.String()
}

// copyHeaders gives a request of the proxy's own the client's headers
// (credentials), but not its conditions or its body's description.
func copyHeaders(dst, src http.Header) {
	for k, v := range src {
		switch http.CanonicalHeaderKey(k) {
		case "If-Match", "Content-Length", "Content-Type", "Connection":
			continue
		}
		dst[k] = append([]string(nil), v...)
	}
}

// ifMatchRevision reads Neutron's "If-Match: revision_number=N".
func ifMatchRevision(r *http.Request) (int64, bool) {
	for _, v := range r.Header.Values("If-Match") {
		for _, part := range strings.Split(v, ",") {
			if s, ok := strings.CutPrefix(strings.TrimSpace(part), "revision_number="); ok {
				if n, err := strconv.ParseInt(s, 10, 64); err == nil {
					return n, true
				}
			}
		}
	}
	return 0, false
}

// change is one entry of a list that the client's body adds or removes.
type change struct {
	list   int // index into partialLists
	remove bool
	entry  json.RawMessage
	key    string
}

// partialPort builds the port body of a PartialPut from the port as
// Neutron holds it (cur) and the client's body (want): of the n changes
// the body makes to the lists it names, the first k land, 1 <= k < n,
// picked by frac in [0, 1), which also says whether the client's
// connection is dropped. ok is false when the body makes fewer than two
// changes (nothing partial to do).
//
// The lists' other entries stay as the port has them. The body's other
// fields (description, ...) are written only when an addition lands, and
// the port's are kept otherwise: a client that records in such a field
// which entries are its own (vpcni marks its addresses in the
// description) then finds every entry that is on the port recorded as it
// would after its whole write or none of it — only records of entries
// that are not on the port, which such a client must tolerate anyway.
// The fault models a batch half committed, not a port corrupted.
func partialPort(cur, want map[string]json.RawMessage, frac float64) (part map[string]json.RawMessage, drop, ok bool) {
	var removals, additions []change
	have := make([][]json.RawMessage, len(partialLists))
	named := make([]bool, len(partialLists))
	for i, name := range partialLists {
		raw, in := want[name]
		if !in {
			continue
		}
		named[i] = true
		var curList, wantList []json.RawMessage
		if c := cur[name]; len(c) > 0 && json.Unmarshal(c, &curList) != nil || json.Unmarshal(raw, &wantList) != nil {
			return nil, false, false
		}
		have[i] = curList
		wanted := map[string]bool{}
		for j, e := range wantList {
			wanted[entryKey(name, "body", e, j)] = true
		}
		onPort := map[string]bool{}
		for j, e := range curList {
			k := entryKey(name, "port", e, j)
			onPort[k] = true
			if !wanted[k] {
				removals = append(removals, change{list: i, remove: true, entry: e, key: k})
			}
		}
		for j, e := range wantList {
			if k := entryKey(name, "body", e, j); !onPort[k] {
				additions = append(additions, change{list: i, entry: e, key: k})
				onPort[k] = true // a duplicate in the body is one change
			}
		}
	}
	changes := append(removals, additions...)
	n := len(changes)
	if n < 2 {
		return nil, false, false
	}
	u := frac * float64(n-1)
	k := 1 + int(u)
	drop = u-math.Floor(u) >= 0.5
	gone := map[string]bool{}
	added := make([][]json.RawMessage, len(partialLists))
	addsLand := false
	for _, c := range changes[:k] {
		if c.remove {
			gone[partialLists[c.list]+"\x00"+c.key] = true
		} else {
			added[c.list] = append(added[c.list], c.entry)
			addsLand = true
		}
	}
	part = map[string]json.RawMessage{}
	if addsLand {
		for f, v := range want {
			part[f] = v
		}
	}
	for i, name := range partialLists {
		if !named[i] {
			continue
		}
		list := []json.RawMessage{}
		for j, e := range have[i] {
			if !gone[name+"\x00"+entryKey(name, "port", e, j)] {
				list = append(list, e)
			}
		}
		list = append(list, added[i]...)
		data, err := json.Marshal(list)
		if err != nil {
			return nil, false, false
		}
		part[name] = data
	}
	return part, drop, true
}

// entryKey names a list entry for comparison: its ip_address; one
// without by its list, its side (body or port) and its position, so that
// it matches nothing.
func entryKey(list, side string, e json.RawMessage, i int) string {
	var v struct {
		IPAddress string `json:"ip_address"`
	}
	if json.Unmarshal(e, &v) != nil || v.IPAddress == "" {
		return fmt.Sprintf("%s#%s%d", list, side, i)
	}
	return v.IPAddress
}
