package cli

import (
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/internal/ops"
)

// LogFlags are a long-running program's --log-level and --log-format.
type LogFlags struct {
	Level, Format string
}

// Add adds the flags to cmd.
func (l *LogFlags) Add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn, error")
	cmd.Flags().StringVar(&l.Format, "log-format", "json", "log format: "+strings.Join(ops.LogFormats, " (for machines, the default), ")+" (key=value, for people)")
	_ = cmd.RegisterFlagCompletionFunc("log-format", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return ops.LogFormats, cobra.ShellCompDirectiveNoFileComp
	})
}

// Logger is the logger the flags ask for, writing to w; a bad value is a usage error.
func (l *LogFlags) Logger(cmd *cobra.Command, w io.Writer) (*slog.Logger, error) {
	log, err := ops.NewLogger(w, l.Level, l.Format)
	if err != nil {
		return nil, Usagef(cmd, "%v", err)
	}
	return log, nil
}
