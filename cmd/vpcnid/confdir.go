package main

import (
	"log/slog"
	"path/filepath"

	"github.com/vpcni/vpcni/internal/cniinstall"
)

// tellConfDir runs once vpcni's network configuration is installed as
// dir/name: it deletes vpcni's own lists under other names (an earlier
// release's 10-vpcni.conflist) and says what else the runtime finds there.
// A file that sorts first wins: vpcni's then serves no new pod, so that is
// a warning (and an Event on the Node, through shadowed). Files that sort
// after are another CNI's left behind while its pods drain: their pods
// keep running, and the runtime sends their DEL to vpcni, which answers
// it without touching anything it never set up.
func tellConfDir(log *slog.Logger, dir, name string, shadowed func(ours string, before []string)) {
	d, err := cniinstall.Tidy(dir, name)
	for _, f := range d.Removed {
		log.Info("vpcni's network configuration under its earlier name removed", "file", filepath.Join(dir, f))
	}
	if err != nil {
		log.Warn("CNI conf dir not tidied", "err", err)
	}
	if len(d.Before) > 0 {
		log.Warn("another CNI network configuration sorts before vpcni's: the runtime gives new pods that network, not vpcni's",
			"uses", d.Before[0], "sorting-first", d.Before, "vpcni", name,
			"fix", "remove them (another CNI's?) or give vpcni's a name that sorts first (-conflist-name)")
		if shadowed != nil {
			shadowed(name, d.Before)
		}
	}
	if len(d.After) > 0 {
		log.Info("other CNI network configurations, unused while vpcni's sorts first (pods they wired keep running; remove them once those are gone)",
			"files", d.After, "vpcni", name)
	}
}
