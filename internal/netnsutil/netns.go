// Package netnsutil creates named network namespaces for vpcni's demo,
// benchmarks and tests, and runs code or sockets inside them.
package netnsutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Path is where `ip netns` keeps a named namespace.
func Path(name string) string { return "/run/netns/" + name }

// Add creates a named namespace, replacing a leftover of the same name, and
// brings its loopback up.
func Add(name string) error {
	if Exists(name) {
		if err := Delete(name); err != nil {
			return err
		}
	}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return Exec(name, "ip", "link", "set", "lo", "up")
}

// Exists says whether a named namespace is there.
func Exists(name string) bool {
	_, err := os.Stat(Path(name))
	return err == nil
}

// Delete removes a named namespace and, with it, its links.
func Delete(name string) error {
	if !Exists(name) {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns delete %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// List names the namespaces that start with prefix.
func List(prefix string) []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Exec runs a command inside a namespace and returns its error with output.
func Exec(name string, argv ...string) error {
	out, err := Output(name, argv...)
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out))
	}
	return nil
}

// Output runs a command inside a namespace and returns its combined output.
func Output(name string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", name}, argv...)...).CombinedOutput()
	return string(out), err
}

// Do runs f on a thread that has entered the namespace at path. Processes f
// starts inherit the namespace; goroutines it starts do not.
func Do(path string, f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromPath(path)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", path, err)
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: Go ends it with this goroutine rather
		// than reuse a thread stuck in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("return from netns %s: %w", path, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// EchoServer answers every line sent to it with the same line. Its socket
// lives in the namespace it was opened in.
type EchoServer struct{ l net.Listener }

// Listen opens a TCP listener on addr inside the namespace at path; it
// serves from any goroutine.
func Listen(path, addr string) (net.Listener, error) {
	var l net.Listener
	err := Do(path, func() (err error) {
		l, err = net.Listen(tcpOf(addr), addr)
		return err
	})
	return l, err
}

// tcpOf is the TCP network of host:port: tcp6 for an IPv6 host, tcp4
// otherwise (a host left empty listens on IPv4 only, as it always did).
func tcpOf(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() && !a.Is4In6() {
		return "tcp6"
	}
	return "tcp4"
}

// ServeEcho opens a TCP echo server on addr inside the namespace at path.
func ServeEcho(path, addr string) (*EchoServer, error) {
	l, err := Listen(path, addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return &EchoServer{l: l}, nil
}

// Close stops the server.
func (s *EchoServer) Close() error { return s.l.Close() }

// Probe connects from the namespace at path to addr, sends a line and
// checks it comes back.
func Probe(ctx context.Context, path, addr string) error {
	return ProbeFrom(ctx, path, netip.Addr{}, addr)
}

// ProbeFrom is Probe from the source address src (any when not valid).
func ProbeFrom(ctx context.Context, path string, src netip.Addr, addr string) error {
	var c net.Conn
	err := Do(path, func() (err error) {
		var d net.Dialer
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err = d.DialContext(ctx, tcpOf(addr), addr)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	const msg = "vpcni-probe\n"
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != msg {
		return fmt.Errorf("echo returned %q", line)
	}
	return nil
}

// VethBetween creates a veth pair whose ends are born in two named
// namespaces (never in the caller's); the second end gets mac if given.
func VethBetween(ns1, name1, ns2, name2 string, mac net.HardwareAddr) error {
	h1, err := netns.GetFromPath(Path(ns1))
	if err != nil {
		return err
	}
	defer h1.Close()
	h2, err := netns.GetFromPath(Path(ns2))
	if err != nil {
		return err
	}
	defer h2.Close()
	nl, err := netlink.NewHandleAt(h1)
	if err != nil {
		return err
	}
	defer nl.Close()
	return nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name1}, PeerName: name2, PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(int(h2))})
}
