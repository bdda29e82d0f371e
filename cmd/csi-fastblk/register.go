package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/fastblk/csi-fastblk/pkg/driver"
	"github.com/fastblk/csi-fastblk/pkg/kubeletreg"
)

// registrationConfig is the kubelet registration's flags.
type registrationConfig struct {
	dir  string // --registration-dir; "" registers nothing
	path string // --kubelet-registration-path; "" is the endpoint's path
}

// newRegistration returns the kubelet registration server of cfg, or nil
// when --registration-dir is empty, and makes the driver's health wait for
// the kubelet's confirmation.
func newRegistration(cfg *serveConfig, drv *driver.Driver) (*kubeletreg.Server, error) {
	if cfg.registration.dir == "" {
		return nil, nil
	}
	path := cfg.registration.path
	if path == "" {
		u, err := url.Parse(cfg.endpoint)
		if err != nil || u.Scheme != "unix" {
			return nil, fmt.Errorf("--registration-dir needs a unix endpoint or --kubelet-registration-path (endpoint %q)", cfg.endpoint)
		}
		path = filepath.Join(u.Host, u.Path)
	}
	reg, err := kubeletreg.New(kubeletreg.Config{Dir: cfg.registration.dir, DriverName: cfg.driver.Name, Endpoint: path})
	if err != nil {
		return nil, err
	}
	drv.AddReadinessCheck("kubelet", reg.Healthy)
	return reg, nil
}

// serveRegistered runs the driver's gRPC server and, when reg is not nil,
// the kubelet registration beside it, until ctx ends or either stops. A
// refused registration is returned as an error, so the plugin exits
// non-zero and its container restarts and registers again.
func serveRegistered(ctx context.Context, drv *driver.Driver, reg *kubeletreg.Server, serve func(context.Context) error) error {
	if reg == nil {
		return serve(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	regErr := make(chan error, 1)
	go func() {
		err := reg.Run(ctx)
		if err != nil {
			klog.ErrorS(err, "kubelet registration ended; exiting so that the container restarts")
			cancel()
		}
		regErr <- err
	}()
	err := serve(ctx)
	cancel()
	return errors.Join(err, <-regErr)
}
