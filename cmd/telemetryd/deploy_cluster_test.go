package main

import (
	"encoding/json"
	"io"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// imageArgs are the flags of the image's ENTRYPOINT (deploy/Dockerfile).
func imageArgs(t *testing.T) []string {
	t.Helper()
	ep := regexp.MustCompile(`(?m)^ENTRYPOINT (\[.*\])$`).FindStringSubmatch(string(readDeploy(t, "Dockerfile")))
	require.NotNil(t, ep)
	var argv []string
	require.NoError(t, json.Unmarshal([]byte(ep[1]), &argv))
	return argv[1:]
}

// composeVars fills ${NAME:?...} the way compose does, from vars.
func composeVars(t *testing.T, s string, vars map[string]string) string {
	t.Helper()
	return regexp.MustCompile(`\$\{([A-Z_]+)(:\?[^}]*)?\}`).ReplaceAllStringFunc(s, func(m string) string {
		name := regexp.MustCompile(`[A-Z_]+`).FindString(m)
		v, ok := vars[name]
		require.True(t, ok, "%s is not made by secrets.sh", name)
		return v
	})
}

// TestDeployClusterCompose: compose-cluster.yaml runs three clustered
// NATS servers and three nodes whose settings pass the service's own
// start-up checks, agree on the cluster-wide ones and differ in the
// per-node ones.
func TestDeployClusterCompose(t *testing.T) {
	inLane(t, lanes.general)
	c := yamlFile[composeFile](t, "compose-cluster.yaml")
	script := string(readDeploy(t, "secrets.sh"))
	vars := map[string]string{}
	for _, name := range []string{"TELEMETRYD_CLUSTER_TOKEN", "TELEMETRYD_CURSOR_KEY"} {
		require.Contains(t, script, name+"=", "secrets.sh writes %s to .env", name)
		vars[name] = strings.Repeat("k", 40)
	}
	routes := ""
	for i, name := range []string{"nats-0", "nats-1", "nats-2"} {
		s, ok := c.Services[name]
		require.True(t, ok, name)
		cmd := strings.Join(s.Command, " ")
		assert.Contains(t, cmd, "--name "+name)
		assert.Contains(t, cmd, "--js")
		r := regexp.MustCompile(`--routes (\S+)`).FindStringSubmatch(cmd)
		require.NotNil(t, r, "%s has routes", name)
		if i == 0 {
			routes = r[1]
		}
		assert.Equal(t, routes, r[1], "every server routes to the same servers")
	}
	for _, name := range []string{"nats-0", "nats-1", "nats-2"} {
		assert.Contains(t, routes, "nats://"+name+":6222")
	}
	args := imageArgs(t)
	var partitions []int
	for i, name := range []string{"node-0", "node-1", "node-2"} {
		s, ok := c.Services[name]
		require.True(t, ok, name)
		assert.True(t, s.Image != "" || s.Build != nil)
		checkEnvKeys(t, "compose "+name, slices.Collect(maps.Keys(s.Environment)))
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = composeVars(t, v, vars)
		}
		cfg := DefaultConfig()
		require.NoError(t, cfg.parseFlags("telemetryd", args, envMap(env), io.Discard), "%s passes the start-up checks", name)
		k := cfg.Cluster
		assert.Equal(t, name, k.NodeName)
		u, err := url.Parse(k.AdvertiseURL)
		require.NoError(t, err)
		assert.Equal(t, name+":8080", u.Host, "%s advertises its own service name", name)
		assert.Equal(t, "https", u.Scheme, "the image serves HTTPS")
		assert.Equal(t, "/etc/telemetryd/ca.crt", env["SSL_CERT_FILE"], "nodes trust the stack's CA")
		for _, n := range []string{"nats-0", "nats-1", "nats-2"} {
			assert.Contains(t, cfg.NATSURL, "nats://"+n+":4222")
			assert.Contains(t, s.DependsOn, n)
		}
		assert.Equal(t, 2, k.Copies)
		assert.Equal(t, 3, k.StreamReplicas)
		partitions = append(partitions, k.Partitions)
		mounts := s.mounts(t, c.Volumes)
		assert.Equal(t, "volume:"+name, mounts["/data"], "each node its own data")
		assert.Equal(t, "secrets", mounts["/etc/telemetryd"])
		_ = i
	}
	assert.Equal(t, []int{12, 12, 12}, partitions)
}

// k8sEnv is a container's env entry, with the forms the cluster uses.
type k8sEnv struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type k8sClusterObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		ServiceName string `yaml:"serviceName"`
		Replicas    int    `yaml:"replicas"`
		ClusterIP   string `yaml:"clusterIP"`
		Template    struct {
			Spec struct {
				Containers []struct {
					Name    string   `yaml:"name"`
					Command []string `yaml:"command"`
					Args    []string `yaml:"args"`
					EnvFrom []struct {
						ConfigMapRef struct{ Name string } `yaml:"configMapRef"`
					} `yaml:"envFrom"`
					Env []k8sEnv `yaml:"env"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestDeployClusterKubernetes: the StatefulSets run three NATS servers
// routed to each other and three nodes whose settings, as the pod
// telemetryd-1 gets them, pass the service's start-up checks.
func TestDeployClusterKubernetes(t *testing.T) {
	inLane(t, lanes.general)
	objs := map[string]k8sClusterObject{}
	for _, f := range []string{"k8s-cluster/nats.yaml", "k8s-cluster/telemetryd.yaml"} {
		for _, o := range yamlDocs[k8sClusterObject](t, f) {
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	nats, ok := objs["StatefulSet/nats"]
	require.True(t, ok)
	assert.Equal(t, 3, nats.Spec.Replicas)
	assert.Equal(t, "None", objs["Service/"+nats.Spec.ServiceName].Spec.ClusterIP, "NATS pods get stable names")
	args := strings.Join(nats.Spec.Template.Spec.Containers[0].Args, " ")
	assert.Contains(t, args, "--js")
	for _, pod := range []string{"nats-0", "nats-1", "nats-2"} {
		assert.Contains(t, args, "nats://"+pod+"."+nats.Spec.ServiceName+":6222")
	}

	sts, ok := objs["StatefulSet/telemetryd"]
	require.True(t, ok)
	assert.Equal(t, 3, sts.Spec.Replicas)
	assert.Equal(t, "None", objs["Service/"+sts.Spec.ServiceName].Spec.ClusterIP)
	ctr := sts.Spec.Template.Spec.Containers[0]
	assert.Equal(t, []string{"telemetryd"}, ctr.Command)
	require.Len(t, ctr.EnvFrom, 1)
	cm, ok := objs["ConfigMap/"+ctr.EnvFrom[0].ConfigMapRef.Name]
	require.True(t, ok)
	env := maps.Clone(cm.Data)
	const pod = "telemetryd-1"
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom.FieldRef != nil:
			assert.Equal(t, "metadata.name", e.ValueFrom.FieldRef.FieldPath)
			env[e.Name] = pod
		case e.ValueFrom.SecretKeyRef != nil:
			assert.Equal(t, "telemetryd-cluster", e.ValueFrom.SecretKeyRef.Name)
			env[e.Name] = strings.Repeat("s", 40)
		default:
			env[e.Name] = strings.ReplaceAll(e.Value, "$(POD_NAME)", pod)
		}
	}
	checkEnvKeys(t, "k8s telemetryd", slices.Collect(maps.Keys(env)))
	cfg := DefaultConfig()
	require.NoError(t, cfg.parseFlags("telemetryd", nil, envMap(env), io.Discard), "the pod's settings pass the start-up checks")
	assert.Equal(t, pod, cfg.Cluster.NodeName)
	assert.Equal(t, "https://"+pod+"."+sts.Spec.ServiceName+":8080", cfg.Cluster.AdvertiseURL)
	assert.Equal(t, 12, cfg.Cluster.Partitions)
	assert.Equal(t, 3, cfg.Cluster.StreamReplicas)
	for _, p := range []string{"nats-0", "nats-1", "nats-2"} {
		assert.Contains(t, cfg.NATSURL, "nats://"+p+"."+nats.Spec.ServiceName+":4222")
	}
}
