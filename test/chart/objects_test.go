package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"
)

// object is the part of every manifest the tests look at; raw keeps the whole
// document for kind-specific decoding.
type object struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   metadata `yaml:"metadata"`
	raw        *yaml.Node
}

type metadata struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type workload struct {
	Spec struct {
		Template struct {
			Metadata metadata `yaml:"metadata"`
			Spec     podSpec  `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	ServiceAccountName string            `yaml:"serviceAccountName"`
	NodeSelector       map[string]string `yaml:"nodeSelector"`
	PriorityClassName  string            `yaml:"priorityClassName"`
	InitContainers     []container       `yaml:"initContainers"`
	Containers         []container       `yaml:"containers"`
	Volumes            []volume          `yaml:"volumes"`
}

type container struct {
	Name            string           `yaml:"name"`
	Image           string           `yaml:"image"`
	ImagePullPolicy string           `yaml:"imagePullPolicy"`
	Args            []string         `yaml:"args"`
	Env             []envVar         `yaml:"env"`
	Ports           []containerPort  `yaml:"ports"`
	VolumeMounts    []volumeMount    `yaml:"volumeMounts"`
	SecurityContext *securityContext `yaml:"securityContext"`
	LivenessProbe   *probe           `yaml:"livenessProbe"`
	Resources       struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	TimeoutSeconds int `yaml:"timeoutSeconds"`
}

type envVar struct {
	Name      string `yaml:"name"`
	ValueFrom *struct {
		FieldRef struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type volumeMount struct {
	Name             string `yaml:"name"`
	MountPath        string `yaml:"mountPath"`
	MountPropagation string `yaml:"mountPropagation"`
	ReadOnly         bool   `yaml:"readOnly"`
}

type securityContext struct {
	Privileged     *bool `yaml:"privileged"`
	SeccompProfile *struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type volume struct {
	Name     string `yaml:"name"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
	Projected *struct {
		Sources []struct {
			ServiceAccountToken *struct {
				Path              string `yaml:"path"`
				Audience          string `yaml:"audience"`
				ExpirationSeconds int    `yaml:"expirationSeconds"`
			} `yaml:"serviceAccountToken"`
		} `yaml:"sources"`
	} `yaml:"projected"`
}

// decodeObjects splits a multi-document YAML stream into objects, skipping
// empty documents.
func decodeObjects(data []byte) ([]object, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var objs []object
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode manifest %d: %w", len(objs)+1, err)
		}
		if len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode {
			continue
		}
		var o object
		if err := n.Decode(&o); err != nil {
			return nil, fmt.Errorf("decode manifest %d: %w", len(objs)+1, err)
		}
		o.raw = &n
		objs = append(objs, o)
	}
}

// decode decodes the whole object into v.
func (o object) decode(v any) error {
	if err := o.raw.Decode(v); err != nil {
		return fmt.Errorf("decode %s %s: %w", o.Kind, o.Metadata.Name, err)
	}
	return nil
}

// arg returns the value of --name=value (or -name=value) and whether it is there.
func (c container) arg(name string) (string, bool) {
	for _, a := range c.Args {
		a = strings.TrimLeft(a, "-")
		if k, v, ok := strings.Cut(a, "="); ok && k == name {
			return v, true
		}
		if a == name {
			return "", true
		}
	}
	return "", false
}

func (c container) mountAt(path string) (volumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return m, true
		}
	}
	return volumeMount{}, false
}

func (p podSpec) volume(name string) (volume, bool) {
	for _, v := range p.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return volume{}, false
}

func (p podSpec) container(name string) (container, bool) {
	for _, c := range p.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return container{}, false
}
