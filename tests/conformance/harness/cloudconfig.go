package main

// The cloud-config file and the connection, made the way CA's externalgrpc client makes them:
// YAML read with sigs.k8s.io/yaml (json tags), grpc_timeout a meta.v1.Duration (Go duration
// string), TLS with the address's host as ServerName, the client key pair and the CA bundle,
// plaintext when no cert is given, and a lazy grpc.Dial (connection errors surface on the
// first RPC, as in CA).

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const defaultGRPCTimeout = 5 * time.Second

type cloudConfig struct {
	Address     string           `json:"address"`
	Key         string           `json:"key"`
	Cert        string           `json:"cert"`
	Cacert      string           `json:"cacert"`
	GRPCTimeout *metav1.Duration `json:"grpc_timeout,omitempty"`
}

func readCloudConfig(path string) (cloudConfig, error) {
	var cfg cloudConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("could not open cloud provider configuration file %q: %w", path, err)
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return cfg, fmt.Errorf("can't parse YAML: %w", err)
	}
	return cfg, nil
}

func (c cloudConfig) timeout() time.Duration {
	if c.GRPCTimeout != nil {
		return c.GRPCTimeout.Duration
	}
	return defaultGRPCTimeout
}

func (c cloudConfig) transport() (grpc.DialOption, error) {
	if c.Cert == "" {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	host, _, err := net.SplitHostPort(c.Address)
	if err != nil {
		return nil, fmt.Errorf("failed to parse address: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
	if err != nil {
		return nil, fmt.Errorf("failed to load cert key pair %q/%q: %w", c.Cert, c.Key, err)
	}
	pem, err := os.ReadFile(c.Cacert)
	if err != nil {
		return nil, fmt.Errorf("could not open Cacert configuration file %q: %w", c.Cacert, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("failed to parse ca %q", c.Cacert)
	}
	creds := credentials.NewTLS(&tls.Config{
		ServerName:   host,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
	})
	return grpc.WithTransportCredentials(creds), nil
}

// dial connects like CA (grpc.Dial: lazy, passthrough resolver).
func (c cloudConfig) dial() (*grpc.ClientConn, error) {
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		return nil, fmt.Errorf("failed to parse address: %w", err)
	}
	opt, err := c.transport()
	if err != nil {
		return nil, err
	}
	//nolint:staticcheck // grpc.Dial is what CA uses; NewClient resolves differently.
	conn, err := grpc.Dial(c.Address, opt)
	if err != nil {
		return nil, fmt.Errorf("failed to dial server: %w", err)
	}
	return conn, nil
}
