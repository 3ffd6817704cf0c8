package admin

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshfed/meshfed/internal/cli"
	meshtls "github.com/meshfed/meshfed/tls"
)

func certsCommand() *cobra.Command {
	group := cli.Group(&cobra.Command{Use: "certs", Short: "Issue certificates from the hub's development CA"})
	var cluster, sink, operator, outDir, stateDir, trustDomain string
	issue := &cobra.Command{
		Use:   "issue (--cluster NAME | --sink NAME | --operator NAME) --out DIR",
		Short: "Issue a minion's, a sink's or an operator's certificate from the development CA",
		Long: "Issue a certificate from the development CA a hub with devCA keeps in its state directory:\n" +
			"a minion's (--cluster), a sink's (--sink) or an operator's (--operator, for the admin API's\n" +
			"actions over adminTLS). NAME.crt, NAME.key (mode 0600) and ca.crt are written into --out.\n" +
			"Keys are secrets: keep --out out of version control (the repository ignores certs/).",
		Example: "  hub certs issue --cluster east --out certs\n  hub certs issue --sink istiod-1 --out certs\n  hub certs issue --operator alice --out certs",
		Args:    cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var kind, name string
			for _, k := range []struct{ kind, name string }{{meshtls.KindCluster, cluster}, {meshtls.KindSink, sink}, {meshtls.KindOperator, operator}} {
				if k.name == "" {
					continue
				}
				if kind != "" {
					return cli.Usagef(cmd, "give exactly one of --cluster, --sink and --operator")
				}
				kind, name = k.kind, k.name
			}
			if kind == "" {
				return cli.Usagef(cmd, "give exactly one of --cluster, --sink and --operator")
			}
			if problems := validation.IsDNS1123Subdomain(name); len(problems) > 0 {
				return cli.Usagef(cmd, "--%s %q: not a valid name (lower case letters, digits, '-' and '.'; it becomes spiffe://%s/%s/NAME and the files' names): %s",
					kind, name, trustDomain, kind, strings.Join(problems, "; "))
			}
			if outDir == "" {
				return cli.Usagef(cmd, "--out: required (the directory to write the certificate, its key and ca.crt into)")
			}
			caDir := filepath.Join(stateDir, "ca")
			ca, err := meshtls.LoadDevCA(caDir)
			if err != nil {
				return err
			}
			if td := caTrustDomain(caDir); td != "" && td != trustDomain {
				return fmt.Errorf("--trust-domain %q: the development CA in %s is trust domain %q's: a hub would refuse the certificate (give --trust-domain %s, or leave it out)",
					trustDomain, caDir, td, td)
			}
			id := meshtls.ID(trustDomain, kind, name)
			files, err := ca.Issue(id, nil, outDir, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "issued %s\n  certFile: %s\n  keyFile: %s\n  caFile: %s\n", id, files.Cert, files.Key, files.CA)
			return nil
		},
	}
	fs := issue.Flags()
	fs.StringVar(&cluster, "cluster", "", "issue a minion's certificate for this cluster")
	fs.StringVar(&sink, "sink", "", "issue a sink's certificate for this name")
	fs.StringVar(&operator, "operator", "", "issue an operator's certificate for this name (for the admin API's actions, over adminTLS)")
	fs.StringVar(&outDir, "out", "", "directory to write NAME.crt, NAME.key (0600) and ca.crt into")
	fs.StringVar(&stateDir, "state-dir", filepath.Join(".meshfed", "hub"), "the hub's state directory (its development CA is in ca/)")
	fs.StringVar(&trustDomain, "trust-domain", meshtls.DevTrustDomain, "the hub's trust domain (the development CA's)")
	group.AddCommand(issue)
	return group
}

// caCommonName is how the development CA names itself: "meshfed development CA (<trust
// domain>)".
var caCommonName = regexp.MustCompile(`^meshfed development CA \(([^()]+)\)$`)

// caTrustDomain is the trust domain the development CA in dir was created for, or "" when
// its certificate does not say.
func caTrustDomain(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return ""
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return ""
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return ""
	}
	if m := caCommonName.FindStringSubmatch(cert.Subject.CommonName); m != nil {
		return m[1]
	}
	return ""
}
