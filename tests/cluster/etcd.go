package main

// The cluster's etcd, embedded in this process: one member on loopback, plain HTTP,
// without fsync (the data is thrown away with the cluster).

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

type etcdServer struct {
	e   *embed.Etcd
	url string
}

func startEtcd(dir string, clientPort, peerPort int, logFile string, timeout time.Duration) (*etcdServer, error) {
	cfg := embed.NewConfig()
	cfg.Name = "captf-envtest"
	cfg.Dir = dir
	client, err := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	if err != nil {
		return nil, err
	}
	peer, err := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	if err != nil {
		return nil, err
	}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{logFile}
	// As kubeadm's etcd: compaction is kube-apiserver's job (every 5 minutes). The
	// quota is etcd's largest suggested one: the state memory bench writes 500 states
	// of 2 MiB, each more than once, between two compactions.
	cfg.QuotaBackendBytes = 8 * 1024 * 1024 * 1024
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(timeout):
		e.Close()
		return nil, fmt.Errorf("not ready after %s (log: %s)", timeout, logFile)
	}
	return &etcdServer{e: e, url: client.String()}, nil
}

func (s *etcdServer) stop() {
	s.e.Close()
}
