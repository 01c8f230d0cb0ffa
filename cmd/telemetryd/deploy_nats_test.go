package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// natsConfMaxPayload is the max_payload of a NATS server configuration,
// read by nats-server's own parser.
func natsConfMaxPayload(t *testing.T, conf string) int32 {
	t.Helper()
	var o server.Options
	require.NoError(t, o.ProcessConfigString(conf))
	return o.MaxPayload
}

// TestDeployNATSMaxPayload: the cluster's NATS servers (compose and
// Kubernetes) load a configuration whose max_payload is at least what
// the embedded server allows, as the README says an external server
// needs.
func TestDeployNATSMaxPayload(t *testing.T) {
	inLane(t, lanes.general)
	t.Run("compose", func(t *testing.T) {
		c := yamlFile[composeFile](t, "compose-cluster.yaml")
		for _, name := range []string{"nats-0", "nats-1", "nats-2"} {
			s := c.Services[name]
			m := regexp.MustCompile(`--config (\S+)`).FindStringSubmatch(strings.Join(s.Command, " "))
			require.NotNil(t, m, "%s loads a configuration file", name)
			src, ok := s.mounts(t, c.Volumes)[m[1]]
			require.True(t, ok, "%s mounts %s", name, m[1])
			conf := string(readDeploy(t, src))
			assert.GreaterOrEqual(t, natsConfMaxPayload(t, conf), int32(natsembed.DefaultMaxPayload), "%s: %s", name, src)
		}
	})
	t.Run("kubernetes", func(t *testing.T) {
		type volume struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
		}
		type object struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Data map[string]string `yaml:"data"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args         []string `yaml:"args"`
							VolumeMounts []struct {
								Name      string `yaml:"name"`
								MountPath string `yaml:"mountPath"`
							} `yaml:"volumeMounts"`
						} `yaml:"containers"`
						Volumes []volume `yaml:"volumes"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		objs := map[string]object{}
		for _, o := range yamlDocs[object](t, "k8s-cluster/nats.yaml") {
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
		pod := objs["StatefulSet/nats"].Spec.Template.Spec
		require.Len(t, pod.Containers, 1)
		ctr := pod.Containers[0]
		m := regexp.MustCompile(`--config=(\S+)`).FindStringSubmatch(strings.Join(ctr.Args, " "))
		require.NotNil(t, m, "the NATS server loads a configuration file")
		dir, file := filepath.Split(m[1])
		var cm string
		for _, vm := range ctr.VolumeMounts {
			if filepath.Clean(vm.MountPath) == filepath.Clean(dir) {
				for _, v := range pod.Volumes {
					if v.Name == vm.Name && v.ConfigMap != nil {
						cm = v.ConfigMap.Name
					}
				}
			}
		}
		require.NotEmpty(t, cm, "%s is mounted from a ConfigMap", dir)
		conf, ok := objs["ConfigMap/"+cm].Data[file]
		require.True(t, ok, "ConfigMap %s holds %s", cm, file)
		assert.GreaterOrEqual(t, natsConfMaxPayload(t, conf), int32(natsembed.DefaultMaxPayload))
	})
}

// TestDeployMemoryLimitVariable: every deploy file sets the memory
// budget with TELEMETRY_MEMORY_LIMIT (which sizes the caches and sets
// the Go runtime's limit), never GOMEMLIMIT alone, and the cluster's
// pods take it from their container limit.
func TestDeployMemoryLimitVariable(t *testing.T) {
	inLane(t, lanes.general)
	err := filepath.WalkDir(deployDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.NotContains(t, string(b), "GOMEMLIMIT", "%s: set TELEMETRY_MEMORY_LIMIT instead", path)
		return nil
	})
	require.NoError(t, err)

	type object struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name string `yaml:"name"`
						Env  []struct {
							Name      string `yaml:"name"`
							ValueFrom struct {
								ResourceFieldRef *struct {
									Resource string `yaml:"resource"`
								} `yaml:"resourceFieldRef"`
							} `yaml:"valueFrom"`
						} `yaml:"env"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	for _, f := range []string{"k8s/statefulset.yaml", "k8s-cluster/telemetryd.yaml"} {
		found := false
		for _, o := range yamlDocs[object](t, f) {
			for _, c := range o.Spec.Template.Spec.Containers {
				for _, e := range c.Env {
					if e.Name == envName("memory-limit") {
						require.NotNil(t, e.ValueFrom.ResourceFieldRef, f)
						assert.Equal(t, "limits.memory", e.ValueFrom.ResourceFieldRef.Resource, f)
						found = true
					}
				}
			}
		}
		assert.True(t, found, "%s sets %s from the container's memory limit", f, envName("memory-limit"))
	}
}
