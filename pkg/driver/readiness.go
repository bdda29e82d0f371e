package driver

import "context"

// readinessCheck is a condition outside the driver's own parts without
// which the plugin does not serve its node, such as the kubelet's
// registration: the plugin is unhealthy while it fails, and Probe answers
// "not ready" rather than an error.
type readinessCheck struct {
	part  string
	check func(context.Context) error
}

// AddReadinessCheck makes Healthy fail, naming part, while check does.
// check's error is told on the network (/healthz), so it must name no host
// path. Call it before serving: it is not safe for concurrent use with
// Healthy.
func (d *Driver) AddReadinessCheck(part string, check func(context.Context) error) {
	d.readiness = append(d.readiness, readinessCheck{part: part, check: check})
}

// ready runs the readiness checks, in the order they were added.
func (d *Driver) ready(ctx context.Context) error {
	for _, c := range d.readiness {
		if err := c.check(ctx); err != nil {
			return &healthError{part: c.part, err: err, notReady: true}
		}
	}
	return nil
}
