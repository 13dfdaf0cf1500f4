package bridge

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// podIPv6Sysctls readies the pod's interface for its IPv6 addresses: IPv6
// on (a runtime may have turned it off for the namespace), no router
// advertisements taken (the pod sits on the segment and would hear the
// subnet router's: its address and default route are vpcni's, from the
// lease), no duplicate address detection for its link-local address (the
// pod's own addresses have IFA_F_NODAD). A /proc/sys the agent cannot
// write (read-only in an unprivileged container) leaves the last two;
// IPv6 off that cannot be turned on is an error naming the cause.
func podIPv6Sysctls(netnsPath, ifName string) error {
	conf := "net/ipv6/conf/" + ifName + "/"
	return netnsutil.Do(netnsPath, func() error {
		if v, err := os.ReadFile("/proc/sys/" + conf + "disable_ipv6"); err != nil {
			return fmt.Errorf("read %s: %w: the node's kernel has IPv6 off (ipv6.disable=1)?", conf+"disable_ipv6", err)
		} else if strings.TrimSpace(string(v)) == "1" {
			if err := nlutil.WriteSysctl(conf+"disable_ipv6", "0"); err != nil {
				return fmt.Errorf("IPv6 is off in the pod's namespace (the runtime set net.ipv6.conf.default.disable_ipv6=1) and cannot be turned on for %s: %w", ifName, err)
			}
		}
		var errs []error
		for _, key := range []string{"accept_ra", "accept_dad"} {
			if err := nlutil.WriteSysctl(conf+key, "0"); err != nil && !errors.Is(err, syscall.EROFS) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}
