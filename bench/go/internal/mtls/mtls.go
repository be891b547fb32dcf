// Package mtls builds the TLS configurations of the benchmark: the server side requires a
// client certificate signed by the CA (as cloudscale-autoscaler does under `tls:`), the client
// side presents one and verifies the server against the same CA, with the host part of the
// address as the server name (as Cluster Autoscaler's externalgrpc client does).
package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
)

func pool(caPath string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caPath)
	if err != nil {
		return nil, err
	}
	certs := x509.NewCertPool()
	if !certs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate found", caPath)
	}
	return certs, nil
}

// Server is the server's TLS config: its certificate, and client certificates required and
// verified against caPath. allowed, when non-empty, restricts the client certificate's CN or
// DNS SANs (cloudscale-autoscaler's tls.allowedClients).
func Server(certPath, keyPath, caPath string, allowed []string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	clients, err := pool(caPath)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clients,
		MinVersion:   tls.VersionTLS12,
	}
	if len(allowed) > 0 {
		cfg.VerifyPeerCertificate = allowClients(allowed)
	}
	return cfg, nil
}

// allowClients checks the verified leaf's CN and DNS SANs once per handshake, not per call.
func allowClients(allowed []string) func([][]byte, [][]*x509.Certificate) error {
	names := map[string]bool{}
	for _, name := range allowed {
		names[name] = true
	}
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		if len(chains) == 0 || len(chains[0]) == 0 {
			return fmt.Errorf("no verified client certificate")
		}
		leaf := chains[0][0]
		if names[leaf.Subject.CommonName] {
			return nil
		}
		for _, dns := range leaf.DNSNames {
			if names[dns] {
				return nil
			}
		}
		return fmt.Errorf("client %q is not allowed", leaf.Subject.CommonName)
	}
}

// Client is the client's TLS config for dialing address (host:port).
func Client(address, certPath, keyPath, caPath string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	servers, err := pool(caPath)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      servers,
		ServerName:   host,
		MinVersion:   tls.VersionTLS12,
	}, nil
}
