package imds

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The IMDSv2 wire contract, as the EC2 User Guide documents it and the Go
// SDK's feature/ec2/imds client reads it.
const (
	// TokenPath is where a session token is asked for, by PUT.
	TokenPath = "/latest/api/token"
	// TTLHeader carries the token's lifetime in seconds (1..21600) on the
	// PUT, and back on its answer: the Go SDK fails without it there.
	TTLHeader = "X-Aws-Ec2-Metadata-Token-Ttl-Seconds"
	// TokenHeader carries the token on every GET.
	TokenHeader = "X-Aws-Ec2-Metadata-Token"
	// MaxTTL is six hours, the longest token EC2 hands out.
	MaxTTL = 21600
)

// Options tune a Server.
type Options struct {
	// Lag holds answers back: the server answers from a snapshot of the
	// source at least Lag old, as the real IMDS shows an ENI or an
	// address only some time after EC2 made it (no bound is documented;
	// aws-vpc-cni has seen a second and more). 0: answers are current.
	Lag time.Duration
	// Refresh: one read of the source serves the requests of this long
	// (0: every request reads it). A source that is an EC2 API costs four
	// calls a read, and an agent reads a dozen paths at start.
	Refresh time.Duration
	// Now is the clock (nil: time.Now): token expiry and lag follow it.
	Now func() time.Time
}

// Server is one instance's IMDSv2: an http.Handler to mount where the
// instance finds 169.254.169.254 (in the lab, a listener the node's
// namespace reaches; in tests, an httptest server).
type Server struct {
	src     Source
	id      string
	now     func() time.Time
	refresh time.Duration

	mu     sync.Mutex
	lag    time.Duration
	tokens map[string]time.Time // token → expiry
	// seen holds the source's states as they were observed, oldest first:
	// the newest one at least lag old is what the server answers, and
	// older ones are dropped.
	seen     []observed
	lastRead time.Time
}

type observed struct {
	at   time.Time
	inst Instance
	err  error
}

var _ http.Handler = (*Server)(nil)

// New serves instance id's metadata from src.
func New(src Source, id string, o Options) *Server {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return &Server{src: src, id: id, now: now, refresh: o.Refresh, lag: o.Lag, tokens: map[string]time.Time{}}
}

// SetLag changes how far the answers lag behind the source from now on.
func (s *Server) SetLag(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lag = d
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == TokenPath {
		s.token(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !s.valid(r.Header.Get(TokenHeader)) {
		// IMDSv2 only (HttpTokens: required): no token, a wrong one or an
		// expired one is 401, which the SDK answers with a new token.
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	inst, err := s.view(r)
	if err != nil {
		http.Error(w, fmt.Sprintf("instance %s: %v", s.id, err), http.StatusInternalServerError)
		return
	}
	var body string
	var ok bool
	switch p := r.URL.Path; {
	case p == "/latest/dynamic/instance-identity/document":
		body, ok = identityDocument(inst), true
	case strings.HasPrefix(p, "/latest/meta-data"):
		body, ok = lookup(metadata(inst, s.now()), strings.TrimPrefix(p, "/latest/meta-data"))
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(body))
}

// token hands out a session token for the TTL the PUT asks.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get("X-Forwarded-For") != "" {
		// EC2 refuses a token to a request that passed a proxy.
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get(TTLHeader))
	if err != nil || ttl < 1 || ttl > MaxTTL {
		http.Error(w, fmt.Sprintf("%s must be 1..%d seconds", TTLHeader, MaxTTL), http.StatusBadRequest)
		return
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	tok := base64.RawURLEncoding.EncodeToString(b)
	now := s.now()
	s.mu.Lock()
	for t, exp := range s.tokens {
		if !now.Before(exp) {
			delete(s.tokens, t)
		}
	}
	s.tokens[tok] = now.Add(time.Duration(ttl) * time.Second)
	s.mu.Unlock()
	w.Header().Set(TTLHeader, strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(tok))
}

func (s *Server) valid(tok string) bool {
	if tok == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.tokens[tok]
	return ok && s.now().Before(exp)
}

// view reads the source now and answers with the newest state observed at
// least lag ago (the oldest one known while none is that old).
func (s *Server) view(r *http.Request) (Instance, error) {
	s.mu.Lock()
	fresh := len(s.seen) > 0 && s.now().Sub(s.lastRead) < s.refresh
	s.mu.Unlock()
	var inst Instance
	var err error
	if !fresh {
		inst, err = s.src.Instance(r.Context(), s.id)
		inst = inst.clone() // kept: the source may change its slices later
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.seen); !fresh && (n == 0 || !sameState(s.seen[n-1], inst, err)) {
		s.seen = append(s.seen, observed{at: now, inst: inst, err: err})
	}
	if !fresh {
		s.lastRead = now
	}
	i := 0
	for j, o := range s.seen {
		if !o.at.After(now.Add(-s.lag)) {
			i = j
		}
	}
	s.seen = s.seen[i:]
	return s.seen[0].inst, s.seen[0].err
}

// clone copies the instance's slices.
func (i Instance) clone() Instance {
	i.Interfaces = slices.Clone(i.Interfaces)
	for k := range i.Interfaces {
		n := &i.Interfaces[k]
		n.SecurityGroups = slices.Clone(n.SecurityGroups)
		n.VPCCIDRs = slices.Clone(n.VPCCIDRs)
		n.LocalIPv4s = slices.Clone(n.LocalIPv4s)
		n.IPv4Prefixes = slices.Clone(n.IPv4Prefixes)
		n.IPv6s, n.IPv6Prefixes = slices.Clone(n.IPv6s), slices.Clone(n.IPv6Prefixes)
		n.SubnetIPv6CIDRs, n.VPCIPv6CIDRs = slices.Clone(n.SubnetIPv6CIDRs), slices.Clone(n.VPCIPv6CIDRs)
	}
	return i
}

func sameState(o observed, inst Instance, err error) bool {
	if (o.err == nil) != (err == nil) || err != nil && o.err.Error() != err.Error() {
		return false
	}
	return reflect.DeepEqual(o.inst, inst)
}

// lookup answers a metadata path from the leaves: a leaf's value, or a
// directory's listing (sub-directories end in '/').
func lookup(leaves map[string]string, p string) (string, bool) {
	p = strings.Trim(p, "/")
	if v, ok := leaves[p]; ok {
		return v, true
	}
	dir := p + "/"
	if p == "" {
		dir = ""
	}
	seen := map[string]bool{}
	var names []string
	for k := range leaves {
		rest, ok := strings.CutPrefix(k, dir)
		if !ok {
			continue
		}
		name, _, sub := strings.Cut(rest, "/")
		if sub {
			name += "/"
		}
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "", false
	}
	slices.Sort(names)
	return strings.Join(names, "\n"), true
}

// metadata lays the instance out as IMDS paths under latest/meta-data/
// (the ones aws-vpc-cni and the SDK's credential provider read).
func metadata(inst Instance, now time.Time) map[string]string {
	m := map[string]string{
		"instance-id":                 inst.ID,
		"instance-type":               inst.Type,
		"placement/availability-zone": inst.AZ,
		"placement/region":            inst.Region,
	}
	if inst.LocalIPv4.IsValid() {
		m["local-ipv4"] = inst.LocalIPv4.String()
		b := inst.LocalIPv4.As4()
		m["local-hostname"] = fmt.Sprintf("ip-%d-%d-%d-%d.%s.compute.internal", b[0], b[1], b[2], b[3], inst.Region)
	}
	for i, nic := range inst.Interfaces {
		if i == 0 {
			m["mac"] = nic.MAC
		}
		d := "network/interfaces/macs/" + nic.MAC + "/"
		m[d+"mac"] = nic.MAC
		m[d+"device-number"] = strconv.Itoa(nic.DeviceNumber)
		m[d+"interface-id"] = nic.ID
		m[d+"network-card"] = strconv.Itoa(nic.NetworkCard)
		m[d+"subnet-id"] = nic.SubnetID
		m[d+"vpc-id"] = nic.VPCID
		if inst.AccountID != "" {
			m[d+"owner-id"] = inst.AccountID
		}
		if len(nic.SecurityGroups) > 0 {
			m[d+"security-group-ids"] = strings.Join(nic.SecurityGroups, "\n")
		}
		if len(nic.LocalIPv4s) > 0 {
			m[d+"local-ipv4s"] = lines(nic.LocalIPv4s)
		}
		if len(nic.IPv4Prefixes) > 0 {
			m[d+"ipv4-prefix"] = lines(nic.IPv4Prefixes)
		}
		if len(nic.IPv6s) > 0 {
			m[d+"ipv6s"] = lines(nic.IPv6s)
			if i == 0 {
				m["ipv6"] = nic.IPv6s[0].String()
			}
		}
		if len(nic.IPv6Prefixes) > 0 {
			m[d+"ipv6-prefix"] = lines(nic.IPv6Prefixes)
		}
		if len(nic.SubnetIPv6CIDRs) > 0 {
			m[d+"subnet-ipv6-cidr-blocks"] = lines(nic.SubnetIPv6CIDRs)
		}
		if len(nic.VPCIPv6CIDRs) > 0 {
			m[d+"vpc-ipv6-cidr-blocks"] = lines(nic.VPCIPv6CIDRs)
		}
		if nic.SubnetCIDR.IsValid() {
			m[d+"subnet-ipv4-cidr-block"] = nic.SubnetCIDR.String()
		}
		if len(nic.VPCCIDRs) > 0 {
			m[d+"vpc-ipv4-cidr-block"] = nic.VPCCIDRs[0].String()
			m[d+"vpc-ipv4-cidr-blocks"] = lines(nic.VPCCIDRs)
		}
	}
	if inst.Role != "" {
		c := inst.Credentials
		exp := c.Expiration
		if exp.IsZero() {
			exp = now.Add(6 * time.Hour)
		}
		creds, _ := json.MarshalIndent(map[string]string{
			"Code": "Success", "LastUpdated": now.UTC().Format(time.RFC3339), "Type": "AWS-HMAC",
			"AccessKeyId": c.AccessKeyID, "SecretAccessKey": c.SecretAccessKey, "Token": c.Token,
			"Expiration": exp.UTC().Format(time.RFC3339),
		}, "", "  ")
		m["iam/security-credentials/"+inst.Role] = string(creds)
		info, _ := json.MarshalIndent(map[string]string{
			"Code": "Success", "LastUpdated": now.UTC().Format(time.RFC3339),
			"InstanceProfileArn": fmt.Sprintf("arn:aws:iam::%s:instance-profile/%s", inst.AccountID, inst.Role),
			"InstanceProfileId":  "AIPA" + strings.ToUpper(strings.ReplaceAll(inst.ID, "-", "")),
		}, "", "  ")
		m["iam/info"] = string(info)
	}
	return m
}

func lines[T fmt.Stringer](v []T) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = x.String()
	}
	return strings.Join(s, "\n")
}

// identityDocument is latest/dynamic/instance-identity/document, where
// the SDK's GetRegion looks.
func identityDocument(inst Instance) string {
	ip := ""
	if inst.LocalIPv4.IsValid() {
		ip = inst.LocalIPv4.String()
	}
	doc, _ := json.MarshalIndent(map[string]any{
		"accountId": inst.AccountID, "architecture": "x86_64", "availabilityZone": inst.AZ,
		"instanceId": inst.ID, "instanceType": inst.Type, "privateIp": ip, "region": inst.Region,
		"version": "2017-09-30",
	}, "", "  ")
	return string(doc)
}

// addrs is a helper for sources: the valid addresses of a list of strings.
func addrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}
