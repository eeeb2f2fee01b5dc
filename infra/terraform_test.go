package infra

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// exportProd exports a plan and reads it back: type → name → body, where a
// body maps each argument to its value (a reference as "${type.name.attr}")
// and each nested block type to the list of its blocks.
func exportProd(t *testing.T, rs []PlannedResource) map[string]map[string]map[string]any {
	t.Helper()
	doc, err := TerraformHCL(rs)
	require.NoError(t, err, "export the plan")
	return parseExport(t, doc)
}

func parseExport(t *testing.T, doc []byte) map[string]map[string]map[string]any {
	t.Helper()
	f, diags := hclsyntax.ParseConfig(doc, "main.tf", hcl.InitialPos)
	require.False(t, diags.HasErrors(), "the export is Terraform: %v\n%s", diags, doc)
	out := map[string]map[string]map[string]any{}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		require.Equal(t, "resource", b.Type, "only resources at the top")
		require.Len(t, b.Labels, 2, "a resource has a type and a name")
		if out[b.Labels[0]] == nil {
			out[b.Labels[0]] = map[string]map[string]any{}
		}
		require.NotContains(t, out[b.Labels[0]], b.Labels[1], "%s.%s once", b.Labels[0], b.Labels[1])
		out[b.Labels[0]][b.Labels[1]] = readBody(t, b.Body)
	}
	return out
}

func readBody(t *testing.T, b *hclsyntax.Body) map[string]any {
	m := map[string]any{}
	for name, a := range b.Attributes {
		m[name] = readExpr(t, a.Expr)
	}
	for _, blk := range b.Blocks {
		list, _ := m[blk.Type].([]any)
		m[blk.Type] = append(list, readBody(t, blk.Body))
	}
	return m
}

func readExpr(t *testing.T, e hclsyntax.Expression) any {
	switch e := e.(type) {
	case *hclsyntax.ScopeTraversalExpr:
		parts := []string{e.Traversal.RootName()}
		for _, step := range e.Traversal[1:] {
			attr, ok := step.(hcl.TraverseAttr)
			require.True(t, ok, "a reference is type.name.attr")
			parts = append(parts, attr.Name)
		}
		return "${" + strings.Join(parts, ".") + "}"
	case *hclsyntax.TupleConsExpr:
		list := []any{}
		for _, el := range e.Exprs {
			list = append(list, readExpr(t, el))
		}
		return list
	default:
		v, diags := e.Value(nil)
		require.False(t, diags.HasErrors(), "a literal: %v", diags)
		j, err := ctyjson.SimpleJSONValue{Value: v}.MarshalJSON()
		require.NoError(t, err)
		var out any
		require.NoError(t, json.Unmarshal(j, &out))
		return out
	}
}

func TestTerraformHCLHasEveryResourceUnderItsTerraformType(t *testing.T) {
	rs := planProd(t)
	got := exportProd(t, rs)
	want := map[string]map[string]bool{}
	for _, r := range rs[1:] {
		tf := TerraformType(r.Type)
		require.NotEmpty(t, tf, "%s %s has a Terraform type", r.Type, r.Name)
		if want[tf] == nil {
			want[tf] = map[string]bool{}
		}
		want[tf][r.Name] = true
	}
	gotNames := map[string]map[string]bool{}
	for typ, byName := range got {
		gotNames[typ] = map[string]bool{}
		for name := range byName {
			gotNames[typ][name] = true
		}
	}
	assert.Equal(t, want, gotNames, "every AWS resource once, the component not at all")
	// The types, spelled out: a typo in the table would otherwise be its own proof.
	assert.Equal(t, map[string]string{
		TypeLoadBalancer:       "aws_lb",
		TypeTargetGroup:        "aws_lb_target_group",
		TypeListener:           "aws_lb_listener",
		TypeAttachment:         "aws_lb_target_group_attachment",
		TypeSecurityGroup:      "aws_security_group",
		TypeIngressRule:        "aws_vpc_security_group_ingress_rule",
		TypeEgressRule:         "aws_vpc_security_group_egress_rule",
		TypeENIAttachment:      "aws_network_interface_sg_attachment",
		TypeBucket:             "aws_s3_bucket",
		TypeBucketEncryption:   "aws_s3_bucket_server_side_encryption_configuration",
		TypeBucketPublicAccess: "aws_s3_bucket_public_access_block",
		TypeBucketPolicy:       "aws_s3_bucket_policy",
		TypeBucketLifecycle:    "aws_s3_bucket_lifecycle_configuration",
	}, func() map[string]string {
		m := map[string]string{}
		for k, v := range terraformTypes {
			m[k] = v.Name
		}
		return m
	}())
}

func TestTerraformHCLUsesTerraformNamesAndBlocks(t *testing.T) {
	tm := altTiming(t)
	rs, err := runProgram(t, tm, "prod", prodConfig(t))
	require.NoError(t, err)
	got := exportProd(t, rs)
	alb := got["aws_lb"][ComponentName+"-alb"]
	assert.Equal(t, true, alb["drop_invalid_header_fields"], "aws_lb %s", ComponentName+"-alb")
	assert.Equal(t, false, alb["internal"])
	assert.Equal(t, true, alb["enable_http2"], "digits stay with their word: enableHttp2 → enable_http2")
	assert.Equal(t, float64(seconds(tm.LBIdleTimeout)), alb["idle_timeout"])
	assert.Equal(t, []any{map[string]any{"bucket": "mythex-placeholder-alb-access-logs", "prefix": "mythex-infra/prod", "enabled": true}}, alb["access_logs"],
		"access_logs is a block")

	tg := got["aws_lb_target_group"][ComponentName+"-tg"]
	require.Len(t, tg["health_check"], 1, "health_check is a block: %v", tg)
	hc := tg["health_check"].([]any)[0].(map[string]any)
	assert.Equal(t, float64(seconds(tm.HealthCheckInterval)), hc["interval"])
	assert.Equal(t, float64(tm.UnhealthyThreshold), hc["unhealthy_threshold"])
	assert.Equal(t, float64(seconds(tm.DeregistrationDelay)), tg["deregistration_delay"])

	http := got["aws_lb_listener"][ComponentName+"-http"]
	assert.Equal(t, []any{map[string]any{
		"type":     "redirect",
		"redirect": []any{map[string]any{"protocol": "HTTPS", "port": "443", "status_code": "HTTP_301"}},
	}}, http["default_action"], "defaultActions are default_action blocks, each with its redirect block")
	assert.NotContains(t, http, "default_actions")
	https := got["aws_lb_listener"][ComponentName+"-https"]
	assert.Equal(t, TLSPolicy, https["ssl_policy"])

	rule := got["aws_vpc_security_group_ingress_rule"][ComponentName+"-alb-in-http-ipv6"]
	assert.Equal(t, "::/0", rule["cidr_ipv6"])
	assert.Equal(t, "tcp", rule["ip_protocol"])
	assert.Equal(t, float64(80), rule["from_port"])
}

// References are what let trivy attach a listener to its load balancer and a
// rule to its security group; without them both are checked as orphans.
func TestTerraformHCLKeepsReferences(t *testing.T) {
	got := exportProd(t, planProd(t))
	albSG := "${aws_security_group." + ComponentName + "-alb-sg.id}"
	srvSG := "${aws_security_group." + ComponentName + "-servers-sg.id}"
	tgARN := "${aws_lb_target_group." + ComponentName + "-tg.arn}"

	assert.Equal(t, []any{albSG}, got["aws_lb"][ComponentName+"-alb"]["security_groups"])
	for _, name := range []string{"-http", "-https"} {
		assert.Equal(t, "${aws_lb."+ComponentName+"-alb.arn}", got["aws_lb_listener"][ComponentName+name]["load_balancer_arn"], "listener %s", name)
	}
	assert.Equal(t, tgARN, got["aws_lb_listener"][ComponentName+"-https"]["default_action"].([]any)[0].(map[string]any)["target_group_arn"])
	for name, a := range got["aws_lb_target_group_attachment"] {
		assert.Equal(t, tgARN, a["target_group_arn"], "attachment %s", name)
	}
	for name, r := range got["aws_vpc_security_group_ingress_rule"] {
		want := albSG
		if name == ComponentName+"-servers-in-app" {
			want = srvSG
			assert.Equal(t, albSG, r["referenced_security_group_id"], "%s admits the ALB's group", name)
		}
		assert.Equal(t, want, r["security_group_id"], "ingress rule %s", name)
	}
	e := got["aws_vpc_security_group_egress_rule"][ComponentName+"-alb-out-app"]
	assert.Equal(t, albSG, e["security_group_id"])
	assert.Equal(t, srvSG, e["referenced_security_group_id"])
}

func TestTerraformHCLRefusesWhatItCannotMap(t *testing.T) {
	rs := planProd(t)
	record := PlannedResource{Type: "aws:route53/record:Record", Name: "mythex-api", Custom: true,
		Inputs: resource.PropertyMap{"name": resource.NewProperty("api")}}
	tg := findResource(t, rs, TypeTargetGroup, ComponentName+"-tg")
	tg.Inputs = tg.Inputs.Copy()
	tg.Inputs["targetFailovers"] = resource.NewProperty([]resource.PropertyValue{
		resource.NewProperty(resource.PropertyMap{"onDeregistration": resource.NewProperty("rebalance")}),
	})
	tg.Inputs["unknownObject"] = resource.NewProperty(resource.PropertyMap{"a": resource.NewProperty("b")})
	var withBad []PlannedResource
	for _, r := range rs {
		if r.Type == TypeTargetGroup {
			r = tg
		}
		withBad = append(withBad, r)
	}
	withBad = append(withBad, record)

	doc, err := TerraformHCL(withBad)
	require.Error(t, err)
	assert.Nil(t, doc, "nothing is written")
	for _, want := range []string{
		"aws:route53/record:Record mythex-api: no Terraform type for aws:route53/record:Record",
		TypeTargetGroup + " mythex-tg: input targetFailovers.0: nested object has no Terraform shape here",
		TypeTargetGroup + " mythex-tg: input unknownObject: an object with no Terraform shape",
	} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestTerraformHCLKeepsLiteralsLiteral(t *testing.T) {
	r := PlannedResource{Type: TypeSecurityGroup, Name: "sg", Custom: true, ID: "dry-plan-sg", Inputs: resource.PropertyMap{
		"description": resource.NewProperty(`costs ${var.x} and %{if} "quoted"`),
		"tags":        resource.NewProperty(resource.PropertyMap{"note": resource.NewProperty("${y}")}),
		// The id of another resource, but nothing says this input came from it.
		"vpcId": resource.NewProperty("dry-plan-sg"),
	}}
	doc, err := TerraformHCL([]PlannedResource{r})
	require.NoError(t, err)
	sg := parseExport(t, doc)["aws_security_group"]["sg"]
	assert.Equal(t, `costs ${var.x} and %{if} "quoted"`, sg["description"], "templates and quotes stay literal:\n%s", doc)
	assert.Equal(t, map[string]any{"note": "${y}"}, sg["tags"])
	assert.Equal(t, "dry-plan-sg", sg["vpc_id"], "only an input that depends on a resource refers to it")
}

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{
		"dropInvalidHeaderFields":   "drop_invalid_header_fields",
		"enableHttp2":               "enable_http2",
		"cidrIpv4":                  "cidr_ipv4",
		"ipv6CidrBlocks":            "ipv6_cidr_blocks",
		"referencedSecurityGroupId": "referenced_security_group_id",
		"port":                      "port",
	} {
		assert.Equal(t, want, snakeCase(in), in)
	}
}
