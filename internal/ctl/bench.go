package ctl

import (
	"errors"
	"io"
)

func bench(args []string, out io.Writer) error {
	return errors.New("bench: coming next")
}
