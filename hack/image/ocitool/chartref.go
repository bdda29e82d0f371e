package main

import (
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// chartRef is the plugin image of the chart in dir with default values:
// plugin.image.repository, and plugin.image.tag or else the chart's
// appVersion (as the chart's csi-fastblk.image helper renders it).
func chartRef(dir string) (string, error) {
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	var values struct {
		Plugin struct {
			Image struct {
				Repository string `yaml:"repository"`
				Tag        string `yaml:"tag"`
			} `yaml:"image"`
		} `yaml:"plugin"`
	}
	for file, v := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return "", err
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
	}
	img := values.Plugin.Image
	tag := img.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	if img.Repository == "" || tag == "" {
		return "", fmt.Errorf("%s: no plugin.image.repository, or neither plugin.image.tag nor appVersion", dir)
	}
	return img.Repository + ":" + tag, nil
}
