// Package cli is what meshfed's commands (hub, minion) share as command lines, on
// spf13/cobra as kubectl and istioctl are: running a command tree with kubectl's error
// and exit conventions, long flags written with one dash as well as two (the deployed
// manifests and scripts say -config), `version` from the binary's build info, the -o
// output formats, and the --log-level/--log-format flags of the programs that log.
//
// It holds no command of its own beyond version: the hub's operator commands are in
// hub/admin, the programs' roots in cmd/hub and cmd/minion.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// ExitError is an error with the exit status it should end the program with.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Execute runs root on args (without the program's name) and returns the exit status: 0,
// or 1 after printing "Error: ..." (or the hub's "Error from server (NotFound): ...") to stderr (an ExitError chooses its status). A usage
// error (an unknown command or flag, wrong arguments) also says where the usage is.
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(Normalize(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SilenceErrors, root.SilenceUsage = true, true
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{c, err} })
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	if msg := err.Error(); strings.HasPrefix(msg, "Error from server") {
		fmt.Fprintln(stderr, msg) // the server's answer, worded as kubectl words it
	} else {
		fmt.Fprintf(stderr, "Error: %v\n", err)
	}
	var ue *usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command ") {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}

// usageError is a command line that does not parse.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// Usagef is an error in how a command was called (its arguments), reported with where its
// usage is.
func Usagef(cmd *cobra.Command, format string, a ...any) error {
	return &usageError{cmd, fmt.Errorf(format, a...)}
}

// Args checks a command's positional arguments with check, reporting its error as a usage
// error that shows the command's use line.
func Args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return Usagef(cmd, "%v (usage: %s)", err, cmd.UseLine())
		}
		return nil
	}
}

// Group makes cmd a group of subcommands: alone it prints its help; with a word that is
// none of its subcommands it is an error suggesting the nearest (cobra does this only for
// the root), never something run.
func Group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		return Usagef(c, "unknown command %q for %q%s", args[0], c.CommandPath(), suggest(c, args[0]))
	}
	return cmd
}

func suggest(c *cobra.Command, typed string) string {
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2 // cobra's default, which it sets for the root only
	}
	s := c.SuggestionsFor(typed)
	if len(s) == 0 {
		return ""
	}
	return "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t") + "\n"
}

// Normalize rewrites the long flags args writes with one dash (-config FILE, -admin=X) to
// pflag's two (--config FILE): the Go flag package took both, and manifests, scripts and
// habits use one. Only names some command of root defines as a long flag of two or more
// letters are rewritten, so shorthand flags (-o json, -h) and values are left alone; nothing
// after "--" is touched.
func Normalize(root *cobra.Command, args []string) []string {
	long := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.PersistentFlags(), c.InheritedFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { long[f.Name] = len(f.Name) > 1 })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	long["help"] = true
	out := make([]string, len(args))
	copy(out, args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if long[name] {
			out[i] = "-" + a
		}
	}
	return out
}

// Main runs root on the program's arguments until it ends or the process is told to stop
// (SIGINT, SIGTERM: the command's context ends and a server shuts down), then exits with
// Execute's status.
func Main(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Execute(ctx, root, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
