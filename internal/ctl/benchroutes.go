package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/routes"
)

// benchRouteBudget puts one block per node on a router whose max_routes
// is smaller than the node count, on the lab's Neutron endpoint (the API
// alone, on loopback): how many blocks get a route, how many are reported
// with the fix, how many route writes Neutron refused (the limit
// configured: none; learned: the one atomic add that teaches it), and
// what raising the limit brings.
func benchRouteBudget(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench route-budget", flag.ContinueOnError)
	nodes := fs.Int("nodes", 40, "nodes, one /26 block each")
	maxRoutes := fs.Int("max-routes", 30, "the router's max_routes")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *nodes < 1 || *nodes > 200 || *maxRoutes < 1 {
		return usageError{"--nodes must be 1..200 and --max-routes at least 1"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := neutronapi.New()
	srv.MaxRoutes = *maxRoutes
	var refused atomic.Int64
	h := srv.Handler()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w, status: 200}
		h.ServeHTTP(rec, r)
		if strings.Contains(r.URL.Path, "extraroutes") && rec.status >= 400 {
			refused.Add(1)
		}
	})}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	nc := openstack.NoAuthClient("http://"+ln.Addr().String(), http.Client{Timeout: 30 * time.Second})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var lines []string
	for _, mode := range []struct {
		name      string
		configure int
	}{{"configured", *maxRoutes}, {"learned", 0}} {
		srv.Lock()
		srv.MaxRoutes = *maxRoutes
		srv.Unlock()
		bed, err := cluster.NewRouteBed(ctx, nc, "bench-"+mode.name, *nodes, netip.MustParsePrefix("10.90.0.0/24"), netip.MustParsePrefix("10.91.0.0/16"), 26, false)
		if err != nil {
			return err
		}
		rec, err := routes.New(bed.Routes(), routes.Options{Ranges: bed.Ranges, MaxRoutes: mode.configure, MaxPairs: 10, Probe: time.Millisecond}, quiet)
		if err != nil {
			return err
		}
		refused.Store(0)
		t0 := time.Now()
		res, err := rec.Sync(ctx, bed.Blocks)
		if err != nil {
			return err
		}
		took := time.Since(t0)
		reported := res.Waiting
		if mode.configure > 0 {
			fmt.Fprintf(out, "route-budget: nodes=%d routes=%d reported=%d\n", *nodes, res.Routes, reported)
		}
		lines = append(lines, fmt.Sprintf("route-budget-%s: nodes=%d routes=%d reported=%d refused=%d sync_ms=%d fix=%q",
			mode.name, *nodes, res.Routes, reported, refused.Load(), took.Milliseconds(), res.Fix))
		if res.Routes+reported != *nodes {
			return fmt.Errorf("route-budget %s: %d routed + %d reported != %d blocks", mode.name, res.Routes, reported, *nodes)
		}
		// Raise the limit: the rest appear.
		srv.Lock()
		srv.MaxRoutes = *nodes
		srv.Unlock()
		if mode.configure > 0 {
			if rec, err = routes.New(bed.Routes(), routes.Options{Ranges: bed.Ranges, MaxRoutes: *nodes, MaxPairs: 10}, quiet); err != nil {
				return err
			}
		}
		time.Sleep(2 * time.Millisecond) // past the learned limit's probe time
		if res, err = rec.Sync(ctx, bed.Blocks); err != nil {
			return err
		}
		if res.Routes != *nodes || res.Waiting != 0 {
			return errors.New("route-budget: after raising max_routes not every block was routed")
		}
		lines = append(lines, fmt.Sprintf("route-budget-%s-raised: max_routes=%d routes=%d reported=%d", mode.name, *nodes, res.Routes, res.Waiting))
	}
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	return nil
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(c int) { s.status = c; s.ResponseWriter.WriteHeader(c) }
