package testbed

import (
	"io"
	"net"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// Forward listens on addr inside namespace ns and splices each connection
// to target as dialled from the caller's own namespace: an agent in a node
// namespace reaches a server on the machine's loopback (neutron-server)
// without anything being added to the root namespace. Close the returned
// listener to stop.
func Forward(ns, addr, target string) (net.Listener, error) {
	l, err := netnsutil.Listen(netnsutil.Path(ns), addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp4", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() {
					_, _ = io.Copy(out, in)
					_ = out.(*net.TCPConn).CloseWrite()
				}()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return l, nil
}
