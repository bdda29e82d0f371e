package dataplane

import "golang.org/x/sys/unix"

// AllowedCPUs lists the CPUs the process may run on (its affinity
// mask); nil when it cannot be read.
func AllowedCPUs() []int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return nil
	}
	var cpus []int
	for c := 0; len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}
