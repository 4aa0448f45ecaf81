package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/engramkv/engram/cmd/engram/internal/config"
)

// loadTLS builds the server TLS configuration from the tls.* keys; nil when
// TLS is not configured. With a client CA, every client must present a
// certificate that CA signed: that is how kube-apiserver's
// --etcd-certfile/--etcd-keyfile authenticate it to etcd.
func loadTLS(c config.TLS) (*tls.Config, error) {
	if c.CertFile == "" && c.KeyFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.cert-file/tls.key-file: %w", err)
	}
	tc := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
	if c.ClientCAFile != "" {
		pool, err := loadCAPool("tls.client-ca-file", c.ClientCAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// loadClusterTLS builds the client TLS configuration a follower uses to
// forward to an https:// leader; nil when no cluster.tls key is set.
func loadClusterTLS(c config.ClusterTLS) (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pool, err := loadCAPool("cluster.tls.ca-file", c.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cluster.tls.cert-file/cluster.tls.key-file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// loadCAPool reads the PEM CA bundle named by the configuration key key;
// errors name the key.
func loadCAPool(key, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", key, file)
	}
	return pool, nil
}
