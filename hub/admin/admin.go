// Package admin is the operator's command line for a hub (cobra commands the hub binary
// adds to its root): `hub status`, `hub get`, `hub why` and `hub whatif` read a running
// hub's admin API and print tables (or the API's documents with -o json|yaml), `hub breaker
// release CLUSTER` asks it to apply the deletions a cluster's breaker holds, `hub certs
// issue` issues a cluster's, a sink's or an operator's certificate from the hub's
// development CA, and `hub subscribe` is an MCP sink that prints what the hub serves it.
//
// Only `hub breaker release` changes a running hub, and the hub takes it only from an
// authenticated operator: with --cert, an operator's certificate, over the hub's adminTLS
// listener (the hub decides; see package hub/api). This is not the admin API itself
// (package hub serves that); it reads the API's documents as package hub/api defines them,
// and links neither the hub's server nor its replica layer (`hub validate`, which needs the
// hub's configuration parser, lives with the hub's main).
package admin

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/internal/cli"
)

// Commands are the operator's commands, for the hub's root command.
func Commands() []*cobra.Command {
	return []*cobra.Command{statusCommand(), getCommand(), whyCommand(), whatifCommand(), breakerCommand(), certsCommand(), subscribeCommand()}
}

// Run runs one operator command line (args without the program's name: "status", "--admin",
// ...) as the hub binary would, writing its output to out; for tests and programs that
// drive the commands without a process.
func Run(ctx context.Context, args []string, out io.Writer) error {
	root := &cobra.Command{Use: "hub", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(Commands()...)
	root.SetArgs(cli.Normalize(root, args))
	root.SetOut(out)
	root.SetErr(io.Discard)
	return root.ExecuteContext(ctx)
}
