// The Function app on a Flex Consumption plan (Linux, Python 3.11), running as a user-assigned
// managed identity. Every connection is identity-based: the host storage, the deployment
// package, Application Insights, Cosmos DB and Service Bus (the last two in appSettings).

@description('Name of the Function app.')
param name string

@description('Name of the Flex Consumption plan.')
param planName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object = {}

@description('azd service name in azure.yaml; azd finds the app by this tag.')
param serviceName string = 'api'

@description('Resource id of the user-assigned identity the app runs as.')
param identityId string

@description('Client id of that identity.')
param identityClientId string

@description('Host storage account (AzureWebJobsStorage).')
param storageAccountName string

@description('URL of the blob container that receives the deployment package.')
param deploymentContainerUrl string

@description('Application Insights component.')
param applicationInsightsName string

@description('App settings of the pipeline: connections and AGENT_LEARNING_* settings.')
param appSettings object

@description('Most instances the app scales out to (caps spend and the load on Cosmos DB and the judge model).')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Memory per instance in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    // checkov:skip=CKV_AZURE_225: zone redundancy needs always-ready instances, which are billed at rest; this plan scales to zero
    reserved: true
  }
}

// Host settings. They come last in the union, so appSettings cannot override them.
var hostSettings = {
  AzureWebJobsStorage__accountName: storageAccountName
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  // The connection string only locates the component; with DisableLocalAuth, ingestion needs the
  // Entra ID token named by the authentication string.
  APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsights.properties.ConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD;ClientId=${identityClientId}'
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: union(tags, {
    'azd-service-name': serviceName
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    // checkov:skip=CKV_AZURE_222: agents read their policy from GET /api/policies/{agent_id} with a function key; without a virtual network Flex Consumption serves it publicly
    // checkov:skip=CKV_AZURE_17: callers authenticate with a function key (or go to Cosmos DB directly with Entra ID); client certificates would be one more credential for every agent
    // checkov:skip=CKV_AZURE_212: the plan scales to zero by design; a minimum instance count would be billed at rest
    // checkov:skip=CKV_AZURE_213: Functions triggers have no HTTP health endpoint to probe; the platform replaces failed instances
    serverFarmId: plan.id
    httpsOnly: true
    publicNetworkAccess: 'Enabled'
    clientCertEnabled: false
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// The checks skipped here are written for the 'web' and 'authsettings' configs of an App Service
// web app; this config holds only app settings.
resource siteAppSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  // checkov:skip=CKV_AZURE_13: App Service Authentication is optional here (modules/app-authentication.bicep turns it on for an app registration): every HTTP function requires a function key, the Personalizer routes their own keys
  // checkov:skip=CKV_AZURE_222: app settings have no network access property; see the site for why it is public
  // checkov:skip=CKV_AZURE_88: Flex Consumption has no Azure Files content share; the package is read from blob storage with the managed identity
  parent: site
  // checkov:skip=CKV_AZURE_63: App Service HTTP logs do not exist on Flex Consumption; requests and traces go to Application Insights
  // checkov:skip=CKV_AZURE_65: detailed error pages are an App Service web-server feature absent from Flex Consumption; errors go to Application Insights
  // checkov:skip=CKV_AZURE_66: failed request tracing is an IIS feature absent from Flex Consumption (Linux); failures go to Application Insights
  // checkov:skip=CKV_AZURE_80: a .NET Framework version applies to Windows web apps; this is a Python 3.11 app
  name: 'appsettings'
  properties: union(appSettings, hostSettings)
}

// No publishing passwords: azd deploys with the signed-in user's Entra ID token.
resource scmBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

resource ftpBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

output name string = site.name
output url string = 'https://${site.properties.defaultHostName}'
