package hub

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	meshtls "github.com/meshfed/meshfed/tls"
)

// devCertificates makes sure the development CA and the hub's serving certificate exist in
// the state directory and returns the serving certificate's files. The certificate names
// the hub (spiffe://<td>/hub/<name>) and the listeners' hosts, and is reissued when it has
// less than 30 days left.
func devCertificates(cfg *Config, log *slog.Logger) (meshtls.Files, error) {
	td := cfg.SPIFFETrustDomain()
	caDir := filepath.Join(cfg.StateDir, "ca")
	ca, created, err := meshtls.EnsureDevCA(caDir, td)
	if err != nil {
		return meshtls.Files{}, fmt.Errorf("devCA: %w", err)
	}
	if created {
		log.Warn("DEVELOPMENT CA created; never use it in production", "dir", caDir, "trust_domain", td)
	}
	tlsDir := filepath.Join(cfg.StateDir, "tls")
	files := meshtls.Files{Cert: filepath.Join(tlsDir, "hub.crt"), Key: filepath.Join(tlsDir, "hub.key"), CA: filepath.Join(tlsDir, "ca.crt")}
	if src, err := meshtls.NewSource(files, log); err == nil && src.ValidFor(30*24*time.Hour) {
		return files, nil
	}
	hosts := []string{"127.0.0.1", "localhost", "::1"}
	for _, a := range []string{cfg.Ingest, cfg.Serve, cfg.AdminTLS} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
			hosts = append(hosts, h)
		}
	}
	files, err = ca.Issue(meshtls.ID(td, meshtls.KindHub, instanceName(cfg)), hosts, tlsDir, "hub")
	if err != nil {
		return meshtls.Files{}, fmt.Errorf("devCA: %w", err)
	}
	log.Warn("development CA: issued the hub's serving certificate", "cert", files.Cert)
	return files, nil
}

// instanceName is the name this hub's certificate carries: its replica name (its peers
// know it by it), else the host name.
func instanceName(cfg *Config) string {
	if cfg.Replicas != nil {
		return cfg.Replicas.Name
	}
	if name, _ := os.Hostname(); name != "" {
		return name
	}
	return "hub"
}
