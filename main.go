// Command mythex-infra is the Pulumi program of the mythex-infra project:
// `pulumi up --stack prod` runs it. Everything it builds is in package infra;
// `go run ./cmd/plan` runs the same program without AWS.
package main

import (
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/mythex/infra/infra"
)

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		// The timing is the compiled contract, the same for every stack.
		lb, err := infra.Build(ctx, infra.Prod())
		if err != nil {
			return err
		}
		for name, value := range lb.Outputs() {
			ctx.Export(name, value)
		}
		return nil
	})
}
